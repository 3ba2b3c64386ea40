//! A conversation as the prompt text a model reads: raw text as it is, chat messages through the
//! model's chat template (with the assistant's turn opened), or, only where the user asks for it,
//! plain `role: content` lines. A model without a template is never given invented markup
//! silently: a base model is driven with raw text.

use std::path::Path;

use lmhost_plugin_api::abi_stable::std_types::RString;
use lmhost_plugin_api::{ConversationSnapshot, Image, Message, Part, PluginError};

use crate::multimodal::Processor;
use crate::template::{ChatContent, ChatMessage, ChatPart, ChatTemplate, ChatToolCall};

/// The option value that asks for `role: content` lines instead of a template.
pub const PLAIN: &str = "plain";

/// How a backend turns chat messages into text.
pub enum PromptFormat {
    /// The model's (or the user's) Jinja chat template.
    Template(ChatTemplate),
    /// One `role: content` line per message, then `assistant:`; chosen by `chat_template = "plain"`.
    Plain,
    /// The model has no template and the user named none: chat messages are refused.
    None,
}

/// A rendered prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub text: String,
    /// Whether the tokenizer adds the special tokens it adds on its own (BOS): yes for raw
    /// text and plain lines; a template writes the ones it wants itself.
    pub add_special: bool,
}

impl PromptFormat {
    /// The format a `chat_template` option names (`"plain"`, a Jinja file or a
    /// `tokenizer_config.json`), or else the model's own template, if it has one.
    pub fn choose(option: Option<&str>, model: Option<ChatTemplate>) -> Result<Self, PluginError> {
        match option {
            Some(PLAIN) => Ok(PromptFormat::Plain),
            Some(path) => ChatTemplate::from_file(Path::new(path))
                .map(PromptFormat::Template)
                .map_err(|e| PluginError::config(format!("option `chat_template`: {e}"))),
            None => Ok(model.map_or(PromptFormat::None, PromptFormat::Template)),
        }
    }

    /// The prompt text for `snapshot`; `model` names the model in the error for a chat
    /// conversation that has no template to go through.
    pub fn render(
        &self,
        snapshot: &ConversationSnapshot,
        model: &str,
    ) -> Result<Prompt, PluginError> {
        if snapshot.has_audio() {
            return Err(PluginError::unsupported(
                "this is a text backend; the conversation has audio",
            ));
        }
        if snapshot.has_images() {
            return Err(PluginError::unsupported(format!(
                "model `{model}` reads text only; the conversation has an image"
            )));
        }
        self.render_parts(snapshot, model, None)
            .map(|(prompt, _)| prompt)
    }

    /// [`PromptFormat::render`] for a vision-language model: every message goes to the
    /// template as a list of parts (`{"type": "image"}` where each image was), and each
    /// image marker the template writes is replaced by the image's markers and placeholders
    /// ([`Processor::image_text`]). Raw text and plain lines carry the image's text where the
    /// image was. The images come back in the order their placeholders stand in the prompt.
    pub fn render_with_images<'s>(
        &self,
        snapshot: &'s ConversationSnapshot,
        model: &str,
        processor: &dyn Processor,
    ) -> Result<(Prompt, Vec<&'s Image>), PluginError> {
        if snapshot.has_audio() {
            return Err(PluginError::unsupported(format!(
                "model `{model}` reads text and images; the conversation has audio"
            )));
        }
        self.render_parts(snapshot, model, Some(processor))
    }

    /// The prompt and its images in order; with no `processor`, a conversation without images.
    fn render_parts<'s>(
        &self,
        snapshot: &'s ConversationSnapshot,
        model: &str,
        processor: Option<&dyn Processor>,
    ) -> Result<(Prompt, Vec<&'s Image>), PluginError> {
        let images: Vec<&Image> = (snapshot.messages().flat_map(|m| m.parts.iter()))
            .filter_map(|part| match part {
                Part::Image { image } => Some(image),
                _ => None,
            })
            .collect();
        let inline = |m: &Message| inline_images(m, processor);
        let (text, add_special) = match self {
            _ if snapshot.is_raw() => (snapshot.messages().map(inline).collect(), true),
            PromptFormat::Template(template) => {
                let texts: Vec<String> = snapshot.messages().map(Message::text_content).collect();
                let messages: Vec<ChatMessage> = (snapshot.messages().zip(&texts))
                    .map(|(m, t)| chat_message(m, t, processor.is_some()))
                    .collect();
                let texts = |list: &'s [RString]| list.iter().map(|t| t.as_str()).collect();
                let (tools, documents): (Vec<&str>, Vec<&str>) =
                    (texts(&snapshot.tools), texts(&snapshot.documents));
                let text = template
                    .render(&messages, &tools, &documents, true)
                    .map_err(|e| PluginError::invalid_input(format!("model `{model}`: {e}")))?;
                match processor {
                    Some(processor) => (expand_markers(&text, &images, processor, model)?, false),
                    None => (text, false),
                }
            }
            PromptFormat::Plain => {
                let lines: Vec<(&str, String)> = snapshot
                    .messages()
                    .map(|m| (m.role.as_str(), inline(m)))
                    .collect();
                (plain(&lines), true)
            }
            PromptFormat::None => return Err(no_template(model)),
        };
        Ok((Prompt { text, add_special }, images))
    }
}

/// A message as a template sees it: its `text`, or its parts in order where it holds images or
/// the model is a vision-language one (`parts`), whose templates are written for the list that
/// Transformers' processors pass (SmolVLM's reads `content[0]['type']` of every message); and
/// its tool calls, or the call it answers. A message of tool calls alone has no `content`.
fn chat_message<'a>(message: &'a Message, text: &'a str, parts: bool) -> ChatMessage<'a> {
    let content = match parts || message.has_images() {
        _ if message.parts.is_empty() && !message.tool_calls.is_empty() => None,
        false => Some(ChatContent::Text(text)),
        true => Some(ChatContent::Parts(
            (message.parts.iter())
                .filter_map(|part| match part {
                    Part::Text { text } => Some(ChatPart::Text { text }),
                    Part::Image { .. } => Some(ChatPart::Image),
                    Part::Audio { .. } => None,
                })
                .collect(),
        )),
    };
    ChatMessage {
        role: message.role.as_str(),
        content,
        tool_calls: (message.tool_calls.iter())
            .map(|call| ChatToolCall {
                id: &call.id,
                name: &call.name,
                arguments: &call.arguments,
            })
            .collect(),
        tool_call_id: message.tool_call_id.as_ref().map(|id| id.as_str()).into(),
    }
}

/// A message's parts as one text, each image as its markers and placeholders.
fn inline_images(message: &Message, processor: Option<&dyn Processor>) -> String {
    (message.parts.iter())
        .map(|part| match (part, processor) {
            (Part::Text { text }, _) => text.to_string(),
            (Part::Image { image }, Some(p)) => p.image_text((image.height, image.width)),
            _ => String::new(),
        })
        .collect()
}

/// `text` with its k-th image marker replaced by image k's text; the template must have
/// written one marker per image.
fn expand_markers(
    text: &str,
    images: &[&Image],
    processor: &dyn Processor,
    model: &str,
) -> Result<String, PluginError> {
    let marker = processor.image_marker();
    let pieces: Vec<&str> = text.split(marker).collect();
    if pieces.len() != images.len() + 1 {
        return Err(PluginError::invalid_input(format!(
            "model `{model}`'s chat template wrote {} image markers (`{marker}`) for the \
             conversation's {} images",
            pieces.len() - 1,
            images.len()
        )));
    }
    let mut out = String::with_capacity(text.len());
    for (piece, image) in pieces.iter().zip(images) {
        out += piece;
        out += &processor.image_text((image.height, image.width));
    }
    out += pieces[pieces.len() - 1];
    Ok(out)
}

fn no_template(model: &str) -> PluginError {
    PluginError::invalid_input(format!(
        "model {model} has no chat template, so it cannot take chat messages: send raw text \
         (`--raw`, messages of role `raw`, or /v1/completions), or set the backend option \
         `chat_template` to a Jinja file, a tokenizer_config.json, or \"plain\" for \
         `role: content` lines"
    ))
}

/// One `role: content` line per message, then `assistant:`.
fn plain(messages: &[(&str, String)]) -> String {
    let mut text: String = messages
        .iter()
        .map(|(role, content)| format!("{role}: {content}\n"))
        .collect();
    text.push_str("assistant:");
    text
}

#[cfg(test)]
mod tests {
    use lmhost_plugin_api::{Grounding, Message, Role, Turn};

    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn chat() -> ConversationSnapshot {
        let messages = vec![
            Message::text(Role::System, "Be brief."),
            Message::text(Role::User, "Hi"),
        ];
        ConversationSnapshot::new(vec![Turn {
            messages: messages.into(),
        }])
        .unwrap()
    }

    #[test]
    fn a_template_renders_chat_with_the_reply_opened() {
        let format = PromptFormat::Template(ChatTemplate::new(CHATML, "test").unwrap());
        let prompt = format.render(&chat(), "m").unwrap();
        assert_eq!(
            prompt.text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(!prompt.add_special);
    }

    #[test]
    fn raw_text_skips_every_format() {
        let raw = ConversationSnapshot::raw("The capital of France is");
        for format in [PromptFormat::Plain, PromptFormat::None] {
            let prompt = format.render(&raw, "m").unwrap();
            assert_eq!(prompt.text, "The capital of France is");
            assert!(prompt.add_special);
        }
    }

    #[test]
    fn plain_lines_only_when_asked() {
        let plain = PromptFormat::choose(Some(PLAIN), None).unwrap();
        assert_eq!(
            plain.render(&chat(), "m").unwrap().text,
            "system: Be brief.\nuser: Hi\nassistant:"
        );
        let none = PromptFormat::choose(None, None).unwrap();
        let err = none.render(&chat(), "base.gguf").unwrap_err();
        assert!(
            err.message.contains("base.gguf has no chat template"),
            "{err}"
        );
        assert!(err.message.contains("raw"), "{err}");
    }

    #[test]
    fn a_missing_template_file_names_the_option() {
        let err = PromptFormat::choose(Some("/nonexistent/t.jinja"), None)
            .err()
            .unwrap();
        assert!(err.message.contains("chat_template"), "{err}");
        assert!(err.message.contains("/nonexistent/t.jinja"), "{err}");
    }

    /// Raw text and plain lines carry each image's markers and placeholders where it was.
    #[test]
    fn raw_and_plain_prompts_inline_images() {
        use crate::multimodal::Gemma3Processor;
        use lmhost_plugin_api::{Image, Part};
        let processor = Gemma3Processor::new(2, |_| Some(7)).unwrap();
        let image = Part::Image {
            image: Image::new(1, 1, vec![0; 3]).unwrap(),
        };
        let message = |role| {
            Message::new(
                role,
                vec![Part::text("Look:"), image.clone(), Part::text("!")],
            )
        };
        let of = |m: Message| {
            ConversationSnapshot::new(vec![Turn {
                messages: vec![m].into(),
            }])
            .unwrap()
        };
        let expected =
            "Look:\n\n<start_of_image><image_soft_token><image_soft_token><end_of_image>\n\n!";
        let raw = of(message(Role::Raw));
        let (raw, images) = PromptFormat::None
            .render_with_images(&raw, "m", &processor)
            .unwrap();
        assert_eq!((raw.text.as_str(), images.len()), (expected, 1));
        let chat = of(message(Role::User));
        let (plain, _) = PromptFormat::Plain
            .render_with_images(&chat, "m", &processor)
            .unwrap();
        assert_eq!(plain.text, format!("user: {expected}\nassistant:"));
    }

    /// A trace reaches the template in Transformers' shape: a message of calls alone has no
    /// `content`, each call's arguments are an object, the answer names its call, and the
    /// tools keep their keys' order.
    #[test]
    fn a_tool_trace_reaches_the_template_as_transformers_passes_it() {
        use lmhost_plugin_api::abi_stable::std_types::ROption;
        use lmhost_plugin_api::ToolCall;
        let dump =
            "{% for m in messages %}{{ m.role }}|{{ m.content is defined }}|{{ m.content }}|\
                    {% if m.tool_calls is defined %}{{ m.tool_calls | tojson }}{% endif %}|\
                    {{ m.tool_call_id }}\n{% endfor %}{{ tools | tojson }}";
        let format = PromptFormat::Template(ChatTemplate::new(dump, "dump").unwrap());
        let calls = vec![ToolCall {
            id: "c1".into(),
            name: "f".into(),
            arguments: r#"{"z": 1, "a": [true]}"#.into(),
        }];
        let messages = vec![
            Message::text(Role::User, "Go"),
            Message {
                tool_calls: calls.into(),
                ..Message::new(Role::Assistant, vec![])
            },
            Message {
                tool_call_id: ROption::RSome("c1".into()),
                ..Message::text(Role::Tool, "done")
            },
        ];
        let tools =
            vec![r#"{"type": "function", "function": {"name": "f", "b": 1, "a": 2}}"#.into()];
        let trace = ConversationSnapshot::grounded(
            vec![Turn {
                messages: messages.into(),
            }],
            Grounding {
                tools,
                ..Grounding::default()
            },
        )
        .unwrap();
        assert_eq!(
            format.render(&trace, "m").unwrap().text,
            "user|True|Go||\n\
             assistant|False||[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"z\": 1, \"a\": [true]}}}]|\n\
             tool|True|done||c1\n\
             [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"b\": 1, \"a\": 2}}]"
        );
    }
}
