//! The parser in each format: whole answers, answers fed in pieces (every
//! split of the markers), text around calls, malformed calls kept as text.

use super::*;

fn reply(format: ToolFormat, parallel: bool) -> ToolReply {
    ToolReply {
        format,
        parallel,
        names: vec!["get_weather".into(), "now".into()],
    }
}

/// Feeds `pieces` one by one: what each push released, then the finish.
fn feed(r: &ToolReply, pieces: &[&str]) -> (Vec<Released>, Released) {
    let mut p = CallParser::new(r.clone());
    let steps: Vec<Released> = pieces.iter().map(|t| p.push(t, None)).collect();
    let mut all = Released::default();
    for s in &steps {
        all.extend(s.clone());
    }
    all.extend(p.finish());
    (steps, all)
}

fn whole(format: ToolFormat, text: &str) -> Released {
    feed(&reply(format, true), &[text]).1
}

fn names_args(r: &Released) -> Vec<(&str, &str)> {
    r.calls
        .iter()
        .map(|c| (c.name.as_str(), c.arguments.as_str()))
        .collect()
}

const QWEN_TWO: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";

#[test]
fn hermes_calls_one_or_several() {
    let r = whole(ToolFormat::Hermes, QWEN_TWO);
    assert_eq!(
        names_args(&r),
        [("get_weather", r#"{"city":"Paris"}"#), ("now", "{}")]
    );
    assert_eq!(r.content, "");
    assert!(r.calls[0].id.starts_with("call_") && r.calls[0].id.len() == 29);
    assert_ne!(r.calls[0].id, r.calls[1].id);
    // Without parallel calls, the first only.
    let (_, r) = feed(&reply(ToolFormat::Hermes, false), &[QWEN_TWO]);
    assert_eq!(names_args(&r), [("get_weather", r#"{"city":"Paris"}"#)]);
}

#[test]
fn text_around_calls_is_content() {
    let text =
        "Let me check.\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\nDone.";
    let r = whole(ToolFormat::Hermes, text);
    assert_eq!(r.content, "Let me check.Done.");
    assert_eq!(names_args(&r), [("now", "{}")]);
    let r = whole(ToolFormat::Hermes, "No tools needed: 4.");
    assert_eq!(
        (r.content.as_str(), r.calls.len()),
        ("No tools needed: 4.", 0)
    );
}

#[test]
fn malformed_calls_stay_content() {
    let bad = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}\n</tool_call>";
    let r = whole(ToolFormat::Hermes, bad);
    assert_eq!((r.content.as_str(), r.calls.len()), (bad, 0));
    let no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
    assert_eq!(whole(ToolFormat::Hermes, no_name).content, no_name);
    // Unclosed at the end: a complete call is read, else it is text.
    let open = "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"tz\": \"UTC\"}}";
    assert_eq!(
        names_args(&whole(ToolFormat::Hermes, open)),
        [("now", r#"{"tz":"UTC"}"#)]
    );
    let cut = "<tool_call>\n{\"name\": \"now\", \"argu";
    assert_eq!(whole(ToolFormat::Hermes, cut).content, cut);
}

#[test]
fn bare_json_is_a_call_only_when_it_names_a_tool() {
    let r = whole(
        ToolFormat::Hermes,
        " {\"name\": \"now\", \"arguments\": \"{\\\"tz\\\": 1}\"}",
    );
    assert_eq!(names_args(&r), [("now", r#"{"tz":1}"#)]);
    for content in [
        "{\"name\": \"Bob\", \"arguments\": {}}",
        "{\"name\": \"now\"}",
        "{\"answer\": 42}",
        "{not json",
    ] {
        let r = whole(ToolFormat::Hermes, content);
        assert_eq!((r.content.as_str(), r.calls.len()), (content, 0));
    }
}

/// Every way of cutting the answer into two pieces: the first piece never
/// releases markup, and the result is the whole answer's.
#[test]
fn a_marker_split_across_tokens_never_leaks() {
    let text = "Sure.\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    let r = reply(ToolFormat::Hermes, true);
    let want = whole(ToolFormat::Hermes, text);
    for cut in 1..text.len() {
        let (steps, all) = feed(&r, &[&text[..cut], &text[cut..]]);
        for s in &steps {
            assert!(!s.content.contains('<'), "cut {cut}: {:?}", s.content);
        }
        assert_eq!(all.content, want.content, "cut {cut}");
        assert_eq!(names_args(&all), names_args(&want), "cut {cut}");
    }
    // Byte by byte: "Sure." is released before the call is complete.
    let pieces: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let (steps, _) = feed(&r, &pieces);
    let first_call = steps.iter().position(|s| !s.calls.is_empty()).unwrap();
    let before: String = steps[..first_call]
        .iter()
        .map(|s| s.content.as_str())
        .collect();
    assert_eq!(before, "Sure.");
    // A `<` that is not a call goes out once it is known.
    let (steps, all) = feed(&r, &["a <", "b", " c"]);
    assert_eq!(steps[0].content, "a");
    assert_eq!(steps[1].content, " <b");
    assert_eq!(all.content, "a <b c");
}

#[test]
fn llama31_json_answers() {
    let one = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
    let r = whole(ToolFormat::Llama3Json, one);
    assert_eq!(names_args(&r), [("get_weather", r#"{"city":"Paris"}"#)]);
    let tagged = format!("<|python_tag|>{one}; {{\"name\": \"now\", \"parameters\": {{}}}}");
    let r = whole(ToolFormat::Llama3Json, &tagged);
    assert_eq!(r.calls.len(), 2);
    assert_eq!(r.content, "");
    // Text is released as it comes, and `<tool_call>` means nothing here.
    let r = reply(ToolFormat::Llama3Json, true);
    let (steps, all) = feed(&r, &["It is", " <tool_call>"]);
    assert_eq!(steps[0].content, "It is");
    assert_eq!(
        (all.content.as_str(), all.calls.len()),
        ("It is <tool_call>", 0)
    );
    // A split python tag is held, then read.
    let (steps, all) = feed(&r, &["<|python", "_tag|>", one]);
    assert!(steps.iter().all(|s| s.content.is_empty()));
    assert_eq!(all.calls.len(), 1);
}

#[test]
fn harmony_calls_on_the_commentary_channel() {
    let r = reply(ToolFormat::Harmony, true);
    let mut p = CallParser::new(r);
    let tokens: [(&str, Option<&str>); 12] = [
        ("<|channel|>", None),
        ("analysis", None),
        ("<|message|>", None),
        ("Need weather.", Some("analysis")),
        ("<|end|>", None),
        ("<|start|>", None),
        ("assistant to=functions.get_weather", None),
        ("<|channel|>", None),
        ("commentary <|constrain|>json", None),
        ("<|message|>", None),
        ("{\"city\": ", Some("commentary")),
        ("\"Paris\"}", Some("commentary")),
    ];
    let mut all = Released::default();
    for (text, channel) in tokens {
        all.extend(p.push(text, channel));
    }
    assert!(all.calls.is_empty(), "a call is read when its message ends");
    all.extend(p.push("<|call|>", None));
    all.extend(p.finish());
    assert_eq!(names_args(&all), [("get_weather", r#"{"city":"Paris"}"#)]);
    assert_eq!(all.content, "");
    // The final channel is content; commentary without a recipient too.
    let mut p = CallParser::new(reply(ToolFormat::Harmony, true));
    let mut all = p.push("<|channel|>final<|message|>", None);
    all.extend(p.push("Hi", Some("final")));
    all.extend(p.finish());
    assert_eq!((all.content.as_str(), all.calls.len()), ("Hi", 0));
}

/// White space after a call is dropped in whichever token it comes (Qwen2.5
/// writes `</tool_call>` as one token and the newline after it as another);
/// found by the `tool_calls` fuzz target.
#[test]
fn white_space_after_a_call_is_dropped_across_tokens() {
    let r = reply(ToolFormat::Hermes, true);
    let call = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    let (_, all) = feed(&r, &["Sure.", call, "\n", " ", "Done."]);
    assert_eq!(all.content, "Sure.Done.");
    assert_eq!(
        all.content,
        whole(ToolFormat::Hermes, &format!("Sure.{call}\n Done.")).content
    );
    // Between two calls and at the end too.
    let (_, all) = feed(&r, &[call, "\n", call, "\n"]);
    assert_eq!((all.content.as_str(), all.calls.len()), ("", 2));
}

/// A number with a long mantissa keeps its value: the arguments' one
/// spelling is the nearest double's, and spelling it again changes nothing
/// (found by the `tool_calls` fuzz target: serde_json's default parser may
/// miss the nearest double by one ulp, so each re-spelling moved the number).
#[test]
fn long_numbers_in_arguments_keep_their_value() {
    let text = "<tool_call>{\"name\": \"now\", \"arguments\": {\"x\": 9999999399999999999999999999999}}</tool_call>";
    let r = whole(ToolFormat::Hermes, text);
    assert_eq!(names_args(&r), [("now", r#"{"x":9.9999994e+30}"#)]);
    assert_eq!(
        normalized(&r.calls[0].arguments).as_deref(),
        Some(r#"{"x":9.9999994e+30}"#)
    );
}
