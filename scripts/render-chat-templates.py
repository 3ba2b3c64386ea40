#!/usr/bin/env python3
"""Renders chat templates exactly as Hugging Face Transformers does, the reference lmhost matches.

Usage: render-chat-templates.py TEMPLATE_DIR CONVERSATIONS_JSON OUTPUT_JSON

Renders every TEMPLATE_DIR/*.jinja over every conversation in CONVERSATIONS_JSON (which also
holds the bos/eos token strings) and writes, per (template, conversation), the text or the
exception raised. The environment mirrors `_cached_compile_jinja_template` and
`render_jinja_template` in transformers 5.x `src/transformers/utils/chat_template_utils.py`, so
transformers itself is not needed, only jinja2 (scripts/setup-python installs it).
"""

import json
import sys
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class AssistantTracker(Extension):
    """Transformers' `{% generation %}...{% endgeneration %}` tag, without the tracking: it
    renders its body unchanged unless assistant masks are asked for, which they are not here."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_generation_support")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Transformers overrides jinja's tojson, which escapes HTML characters.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def strftime_now(format):
    return datetime.now().strftime(format)


def compile_template(source):
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def outcome(render):
    try:
        return {"text": render()}
    except Exception as e:  # the reference records whatever the template raised
        return {"error": f"{type(e).__name__}: {e}"}


def render_all(template_dir, fixture):
    results = []
    for path in sorted(Path(template_dir).glob("*.jinja")):
        compiled = outcome(lambda: compile_template(path.read_text(encoding="utf-8")))
        for conversation in fixture["conversations"]:
            case = {"template": path.name, "conversation": conversation["name"]}
            if "error" in compiled:
                results.append({**case, **compiled})
                continue
            template = compiled["text"]
            # `render_jinja_template` passes tools and documents even when there are none.
            results.append({**case, **outcome(lambda: template.render(
                messages=conversation["messages"],
                tools=conversation.get("tools"),
                documents=conversation.get("documents"),
                add_generation_prompt=conversation["add_generation_prompt"],
                bos_token=fixture["bos_token"],
                eos_token=fixture["eos_token"],
            ))})
    return results


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    template_dir, fixture_path, output = sys.argv[1:]
    fixture = json.loads(Path(fixture_path).read_text(encoding="utf-8"))
    results = render_all(template_dir, fixture)
    report = {"jinja2": jinja2.__version__, "results": results}
    Path(output).write_text(json.dumps(report, ensure_ascii=False, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
