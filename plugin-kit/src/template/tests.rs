//! Unit tests; `tests/chat_templates.rs` compares against jinja2 over real templates. Expected
//! texts of the Python-isms were produced by jinja2 in Transformers' environment.

use serde_json::json;

use super::*;

const HF_STYLE: &str =
    "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content.strip() }}\
    {{ eos_token }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";

fn user(content: &str) -> [ChatMessage<'_>; 1] {
    [ChatMessage::new("user", content)]
}

/// Renders `source` over one user message "hi".
fn render(source: &str) -> Result<String, TemplateError> {
    ChatTemplate::new(source, "test.jinja")?.render(&user("hi"), &[], &[], true)
}

fn rendered(source: &str) -> String {
    render(source).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn tokenizer_config_sets_template_and_special_tokens() {
    let config = json!({
        "chat_template": HF_STYLE,
        "bos_token": "<s>",
        "eos_token": {"content": "</s>", "lstrip": false},
    });
    let template = ChatTemplate::from_json(&config, "tokenizer_config.json").unwrap();
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", " Hi "),
    ];
    let text = template.render(&messages, &[], &[], true).unwrap();
    assert_eq!(text, "<s><system>Be brief.</s><user>Hi</s><assistant>");
    assert_eq!(
        template.render(&messages[..1], &[], &[], false).unwrap(),
        "<s><system>Be brief.</s>"
    );
    assert_eq!(template.source(), HF_STYLE);
    assert_eq!(template.origin(), "tokenizer_config.json");
}

#[test]
fn server_props_answer() {
    let props = json!({
        "chat_template": "{{ bos_token }}[{{ messages[0].content }}]",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "default_generation_settings": {"n_ctx": 4096},
    });
    let template = ChatTemplate::from_json(&props, "server /props").unwrap();
    assert_eq!(
        template.render(&user("x"), &[], &[], true).unwrap(),
        "<|begin_of_text|>[x]"
    );
}

#[test]
fn a_list_of_named_templates_gives_the_default() {
    let config = json!({"chat_template": [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "default"},
    ]});
    let template = ChatTemplate::from_json(&config, "cfg").unwrap();
    assert_eq!(template.render(&[], &[], &[], true).unwrap(), "default");

    let config = json!({"chat_template": [{"name": "rag", "template": "x"}]});
    let err = ChatTemplate::from_json(&config, "cfg")
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "cfg holds chat templates named [\"rag\"] but none named \"default\""
    );
}

#[test]
fn json_without_a_template_is_refused() {
    let err = ChatTemplate::from_json(&json!({"bos_token": "<s>"}), "server /props").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("server /props holds no `chat_template`"),
        "{err}"
    );
}

#[test]
fn missing_special_tokens_are_undefined() {
    let template = ChatTemplate::new("{{ bos_token is defined }}|{{ eos_token }}|", "t").unwrap();
    assert_eq!(template.render(&[], &[], &[], true).unwrap(), "False||");
}

#[test]
fn from_file_reads_jinja_and_tokenizer_config() {
    let dir = tempfile::tempdir().unwrap();
    let jinja = dir.path().join("chat.jinja");
    std::fs::write(&jinja, "{{ messages[0].content }}\n").unwrap();
    let template = ChatTemplate::from_file(&jinja).unwrap();
    // jinja2 drops the file's final newline (keep_trailing_newline=False).
    assert_eq!(template.render(&user("hi"), &[], &[], true).unwrap(), "hi");
    assert_eq!(template.origin(), jinja.display().to_string());

    let config = dir.path().join("tokenizer_config.json");
    std::fs::write(
        &config,
        json!({"chat_template": HF_STYLE, "bos_token": "<s>"}).to_string(),
    )
    .unwrap();
    let template = ChatTemplate::from_file(&config).unwrap();
    assert_eq!(
        template.render(&user("hi"), &[], &[], true).unwrap(),
        "<s><user>hi<assistant>"
    );

    let missing = dir.path().join("absent.jinja");
    let err = ChatTemplate::from_file(&missing).unwrap_err().to_string();
    assert!(
        err.contains("cannot read chat template") && err.contains("absent.jinja"),
        "{err}"
    );
}

#[test]
fn compile_errors_name_origin_line_and_construct() {
    let err = ChatTemplate::new(
        "{{ bos_token }}\n{% if x %}\n{% frobnicate %}",
        "GGUF tokenizer.chat_template",
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "chat template from GGUF tokenizer.chat_template does not compile at line 3: \
         syntax error: unknown statement frobnicate"
    );
}

#[test]
fn raise_exception_names_origin_line_and_message() {
    let source = "{% for m in messages %}\n{% if m.role == 'user' %}\n\
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
        {% endif %}{% endfor %}";
    let err = render(source).unwrap_err();
    assert!(matches!(err, TemplateError::Raised { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "chat template from test.jinja raised at line 3: \
         Conversation roles must alternate user/assistant/user/assistant/..."
    );
}

#[test]
fn render_errors_name_what_failed() {
    let err = render("\n{{ messages[0].nothing.deeper }}")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("chat template from test.jinja fails at line 2: "),
        "{err}"
    );
    assert!(err.contains("undefined"), "{err}");
}

#[test]
fn generation_tags_render_their_body_in_a_scope_of_their_own() {
    let source = "{% set x = 1 %}\n{% for m in messages %}\n  {%- generation %}\n\
        {% set x = 2 %}[{{ m.content }}]\n  {% endgeneration -%}\n{% endfor %}{{ x }}";
    let plain = "{% set x = 1 %}\n{% for m in messages %}\n  {%- with %}\n\
        {% set x = 2 %}[{{ m.content }}]\n  {% endwith -%}\n{% endfor %}{{ x }}";
    assert_eq!(rendered(source), "[hi]\n1"); // as jinja2 renders it
    assert_eq!(rendered(source), rendered(plain));
    // The source is kept as given.
    let template = ChatTemplate::new(source, "t").unwrap();
    assert_eq!(template.source(), source);
}

#[test]
fn loops_over_none_fail_as_in_python() {
    let err = render("{% for tool in tools %}{{ tool }}{% endfor %}").unwrap_err();
    assert!(
        err.to_string()
            .contains("'NoneType' object is not iterable"),
        "{err}"
    );
    // Undefined iterates as empty; filters, `recursive` and `loop` work through the check.
    assert_eq!(rendered("{% for t in nothing %}x{% endfor %}."), ".");
    assert_eq!(
        rendered(
            "{%- for n in [1, 2, 3] if n != 2 -%}{{ n }}{{ ',' if not loop.last }}{%- endfor %}"
        ),
        "1,3"
    );
    assert_eq!(
        rendered(
            "{% for k, v in {'a': [1], 'b': []}.items() %}{{ k }}{{ v | length }}{% endfor %}"
        ),
        "a1b0"
    );
    let tree = "{% for n in [{'c': [{'c': []}]}] recursive %}<{{ loop(n.c) }}>{% endfor %}";
    assert_eq!(rendered(tree), "<<>>");
    // Text that only looks like a loop is left alone.
    assert_eq!(
        rendered("{# {% for x in none %} #}{{ '{% for x in none %}' }}"),
        "{% for x in none %}"
    );
    assert_eq!(
        rendered("{% raw %}{% for x in none %}{% endraw %}"),
        "{% for x in none %}"
    );
}

#[test]
fn tests_answer_as_jinja2_does() {
    assert_eq!(
        rendered("{{ tools is iterable }} {{ nothing is iterable }} {{ 'ab' is sequence }} {{ {} is sequence }} {{ true is number }}"),
        "False True True True True"
    );
}

#[test]
fn tojson_is_json_dumps() {
    let cases = [
        (
            r#"{{ {"b": [1, 2.5, none, true], "a": "<x> & é"} | tojson }}"#,
            r#"{"b": [1, 2.5, null, true], "a": "<x> & é"}"#,
        ),
        (
            r#"{{ {"b": 1, "a": {"c": []}} | tojson(indent=2) }}"#,
            "{\n  \"b\": 1,\n  \"a\": {\n    \"c\": []\n  }\n}",
        ),
        (
            r#"{{ "é👋" | tojson(ensure_ascii=True) }}"#,
            r#""\u00e9\ud83d\udc4b""#,
        ),
        (
            r#"{{ {"b": 1, "a": 2} | tojson(sort_keys=True) }}"#,
            r#"{"a": 2, "b": 1}"#,
        ),
        (
            r#"{{ [1e16, 1e-05, 0.1, 100.0] | tojson }}"#,
            "[1e+16, 1e-05, 0.1, 100.0]",
        ),
        (
            r#"{{ "a\"\\\n\t\u0001" | tojson }}"#,
            r#""a\"\\\n\t\u0001""#,
        ),
        (
            r#"{{ {"a": [1, 2]} | tojson(separators=[",", ":"]) }}"#,
            r#"{"a":[1,2]}"#,
        ),
        (
            r#"{{ messages | tojson }}"#,
            r#"[{"role": "user", "content": "hi"}]"#,
        ),
    ];
    for (source, expected) in cases {
        assert_eq!(rendered(source), expected, "{source}");
    }
    let err = render("{{ nothing | tojson }}").unwrap_err().to_string();
    assert!(err.contains("not JSON serializable"), "{err}");
}

#[test]
fn values_print_as_python_prints_them() {
    assert_eq!(
        rendered(
            r#"{{ none }}|{{ true }}|{{ [1, "it's", none] }}|{{ {"k": false} }}|{{ 1e16 }}|{{ 2.0 }}|{{ true | string }}"#
        ),
        r#"None|True|[1, "it's", None]|{'k': False}|1e+16|2.0|True"#
    );
}

#[test]
fn python_methods_and_jinja2_globals() {
    let source = "{% set ns = namespace(n=0) %}{% for w in ' a b '.split() %}{% set ns.n = ns.n + 1 %}\
        {% endfor %}{{ ns.n }} {{ dict(a=1).get('a') }} {{ 'Hi'.upper() }} {{ 'x,y'.split(',') | length }}";
    assert_eq!(rendered(source), "2 1 HI 2");
    let year = rendered("{{ strftime_now('%Y') }}");
    assert_eq!(year, chrono::Local::now().format("%Y").to_string());
}

#[test]
fn loop_controls() {
    let source = "{% for n in range(9) %}{% if n == 1 %}{% continue %}{% endif %}\
        {% if n == 3 %}{% break %}{% endif %}{{ n }}{% endfor %}";
    assert_eq!(rendered(source), "02");
}

/// A hostile template is refused within its limits, naming the limit: a loop of 10^10 turns
/// runs out of fuel, an output of a gigabyte stops at the cap, a macro that calls itself stops
/// at the recursion depth, and a gigabyte string by repetition is refused by minijinja itself.
/// Each returns at once and holds at most the output cap (timings printed, not asserted).
/// The memory-bound cases are below.
#[test]
fn hostile_templates_are_refused_within_the_limits() {
    let cases = [
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "exceeds its fuel of 20000000 instructions",
        ),
        (
            "{% for i in range(100000) %}{{ 'x' * 10000 }}{% endfor %}",
            "exceeds its output limit of 64 MiB",
        ),
        (
            "{% macro down(n) %}{{ down(n + 1) }}{% endmacro %}{{ down(0) }}",
            "exceeds its recursion depth of 100",
        ),
        ("{{ 'x' * 1000000000 }}", "repeated string is too large"),
    ];
    for (source, expected) in cases {
        let started = std::time::Instant::now();
        let err = render(source).unwrap_err().to_string();
        eprintln!("{source}: refused in {:.2?}", started.elapsed());
        assert!(err.contains(expected), "{source}: {err}");
        assert!(err.starts_with("chat template from test.jinja"), "{err}");
    }
}

/// Values a template doubles until they would take gigabytes, which no instruction count or
/// output cap sees: `~` in a namespace loop, `+` in straight-line code, `replace` feeding
/// itself, and a macro's captured output fed back to it. Each is refused at the
/// memory limit, and the process that asked is untouched (checked by the render after them).
#[cfg(target_os = "linux")]
#[test]
fn templates_that_fill_memory_are_refused_at_the_memory_limit() {
    let doublings = "{% set ns = namespace(s='x') %}{% for i in range(40) %}\
        {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}";
    let straight = format!(
        "{{% set s = 'xy' %}}{}{{{{ s|length }}}}",
        "{% set s = s + s %}".repeat(40)
    );
    let replaced = "{% set ns = namespace(s='xx') %}{% for i in range(40) %}\
        {% set ns.s = ns.s|replace('x', 'xx') %}{% endfor %}{{ ns.s|length }}";
    let captured =
        "{% macro twice(s) %}{{ s }}{{ s }}{% endmacro %}{% set ns = namespace(s='x') %}\
        {% for i in range(40) %}{% set ns.s = twice(ns.s) %}{% endfor %}{{ ns.s|length }}";
    let limit = format!("exceeds its memory limit of {} MiB", limits::MEMORY >> 20);
    for source in [doublings, &straight, replaced, captured] {
        let started = std::time::Instant::now();
        let err = render(source).unwrap_err().to_string();
        eprintln!("{source}: refused in {:.2?}", started.elapsed());
        assert!(err.contains(&limit), "{source}: {err}");
        assert!(err.starts_with("chat template from test.jinja"), "{err}");
    }
    assert_eq!(rendered(HF_STYLE), "<user>hi<assistant>");
}

/// The same doubling loop, stopped short of the limit, renders: the sandbox refuses the memory,
/// not the construct.
#[test]
fn a_template_that_grows_within_the_memory_limit_renders() {
    let source = "{% set ns = namespace(s='x') %}{% for i in range(20) %}\
        {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}";
    assert_eq!(rendered(source), (1 << 20).to_string());
}
