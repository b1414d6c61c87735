//! Any template (the input up to its first NUL byte) rendering a
//! conversation whose messages come from the rest: compiling or rendering
//! may fail; neither may panic, loop or grow without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use worker_orcd::tokenizer::{ChatMessage, ChatTemplate};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (source, rest) = text.split_once('\0').unwrap_or((&text, ""));
    let Ok(template) = ChatTemplate::new(source, "<s>", "</s>") else {
        return;
    };
    let roles = ["system", "user", "assistant", "tool"];
    let messages: Vec<ChatMessage> = rest
        .split('\0')
        .enumerate()
        .map(|(i, content)| ChatMessage::new(roles[i % roles.len()], content))
        .collect();
    let _ = template.render(&messages, true);
});
