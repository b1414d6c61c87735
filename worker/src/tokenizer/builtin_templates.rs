//! Chat templates the worker knows by name, for model files that carry none
//! (Gemma 3's GGUF, many conversions) or carry a wrong one:
//! `--chat-template NAME`. The names are llama.cpp's (`llama-server
//! --chat-template`); the sources are the Hugging Face templates of those
//! families, text-only (no tools, no images).

/// `(name, Jinja source)`, in the order `--help` and errors list them.
pub const BUILTIN_TEMPLATES: &[(&str, &str)] = &[
    ("chatml", CHATML),
    ("llama3", LLAMA3),
    ("gemma", GEMMA),
    ("phi3", PHI3),
];

/// The source of the built-in template `name`.
pub fn builtin_template(name: &str) -> Option<&'static str> {
    BUILTIN_TEMPLATES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, src)| *src)
}

/// The built-in names, comma-separated (for messages).
pub fn builtin_template_names() -> String {
    BUILTIN_TEMPLATES
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Qwen, SmolLM, Hermes and many more.
const CHATML: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Llama 3 and 3.1 instruct (Meta's template without the tools preamble).
const LLAMA3: &str = "{% for message in messages %}\
{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}\
{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}\
{{ content }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/// Gemma 2 and 3 instruct: no system role (a system message opens the first
/// user turn), `model` for the assistant, turns that must alternate.
const GEMMA: &str = "{{ bos_token }}\
{% if messages[0]['role'] == 'system' %}\
{% set first_user_prefix = messages[0]['content'] + '\n\n' %}{% set loop_messages = messages[1:] %}\
{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}\
{% for message in loop_messages %}\
{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
{% endif %}\
{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}\
{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

/// Phi-3 (mini, small, medium) instruct.
const PHI3: &str = "{% for message in messages %}\
{% if message['role'] in ['system', 'user', 'assistant'] %}\
{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}\
{% endif %}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{ChatMessage, ChatTemplate};

    fn render(name: &str, messages: &[(&str, &str)], bos: &str, eos: &str) -> String {
        let t = ChatTemplate::new(builtin_template(name).unwrap(), bos, eos).unwrap();
        let msgs: Vec<ChatMessage> = messages
            .iter()
            .map(|(r, c)| ChatMessage::new(*r, *c))
            .collect();
        t.render(&msgs, true).unwrap()
    }

    const CHAT: &[(&str, &str)] = &[
        ("system", "Be brief."),
        ("user", "Hi"),
        ("assistant", "Hello."),
        ("user", " Why? "),
    ];

    /// Each built-in renders a conversation as its family's reference
    /// template does (expected strings written from the Hugging Face
    /// templates of Qwen2.5, Llama 3.1, Gemma 3 and Phi-3-mini).
    #[test]
    fn builtins_render_as_their_families_do() {
        assert_eq!(
            render("chatml", CHAT, "", ""),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n Why? <|im_end|>\n\
             <|im_start|>assistant\n"
        );
        assert_eq!(
            render("llama3", CHAT, "<|begin_of_text|>", "<|eot_id|>"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nWhy?<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert_eq!(
            render("gemma", CHAT, "<bos>", "<eos>"),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            render("phi3", CHAT, "<s>", "<|endoftext|>"),
            "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n\
             <|user|>\n Why? <|end|>\n<|assistant|>\n"
        );
    }

    #[test]
    fn gemma_refuses_turns_that_do_not_alternate() {
        let t = ChatTemplate::new(builtin_template("gemma").unwrap(), "<bos>", "<eos>").unwrap();
        let msgs = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
        let err = t.render(&msgs, true).unwrap_err().to_string();
        assert!(err.contains("must alternate"), "{err}");
    }

    #[test]
    fn names_are_listed_and_unknown_ones_are_none() {
        assert_eq!(builtin_template_names(), "chatml, llama3, gemma, phi3");
        assert!(builtin_template("vicuna").is_none());
    }
}
