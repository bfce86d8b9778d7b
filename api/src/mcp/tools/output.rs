//! How much of a command's output a `sandbox_exec` result carries, and the text rendering
//! of every result carrying output or a file (`sandbox_exec`, `process_output`,
//! `files_read`): the bulk once, readably, up to [`TEXT_OUTPUT_BYTES`] ([`excerpts`]).
//!
//! A result is one JSON-RPC message, and over HTTP a streamed call's result is one SSE event:
//! the official Python SDK refuses an event over 1 MiB by default (`max_sse_event_size`), and
//! fails the call. `/v1` keeps 1 MiB of each stream, and a byte of output can take 6 bytes of
//! JSON (`\u0001`), so the output `/v1` keeps does not fit one event whatever the rendering.
//! A result therefore carries the first [`RESULT_OUTPUT_BYTES`] of output (stdout and stderr
//! together, counted as the JSON text that carries them) in its structured content, says what
//! it left out (`…Truncated`, `…OmittedBytes`), and renders a shorter excerpt as text
//! ([`TEXT_OUTPUT_BYTES`]) that points at the structured fields: MCP asks for structured
//! content to be repeated as text only as a SHOULD, and repeating up to 768 KiB would double
//! the message. The same bound holds buffered or streamed, over HTTP or stdio, so a call's
//! result does not depend on how it was made.

use serde_json::{json, Value};

/// The most output a result's structured content carries: stdout and stderr together,
/// counted as JSON string content (a control character is 6 bytes, `"` and `\` are 2).
pub const RESULT_OUTPUT_BYTES: usize = 768 * 1024;

/// The most output the text rendering shows, counted the same way.
pub const TEXT_OUTPUT_BYTES: usize = 64 * 1024;

/// The largest JSON-RPC message a result may be, with margin under the 1 MiB SSE event of
/// the SDKs' default, for the envelope, the request's id and the event's own lines: checked
/// by the tests against the worst output.
#[cfg(test)]
const MESSAGE_BOUND: usize = 900 * 1024;

/// The tool result of a finished command: `v1` is `/v1` exec's answer (`exitCode`,
/// `durationMs`, `stdout`, `stderr`, `stdoutTruncated`, `stderrTruncated`); `base64` when the
/// output is base64 (`outputEncoding`).
pub(super) fn result(v1: &Value, base64: bool) -> Value {
    let out = v1["stdout"].as_str().unwrap_or_default();
    let err = v1["stderr"].as_str().unwrap_or_default();
    let (out_room, err_room) = share(RESULT_OUTPUT_BYTES, json_len(out), json_len(err));
    let (kept_out, kept_err) = (prefix(out, out_room, base64), prefix(err, err_room, base64));
    let omitted = |all: &str, kept: &str| {
        if base64 {
            decoded_len(all) - decoded_len(kept)
        } else {
            all.len() - kept.len()
        }
    };
    let (omitted_out, omitted_err) = (omitted(out, kept_out), omitted(err, kept_err));
    let structured = json!({
        "exitCode": v1["exitCode"],
        "durationMs": v1["durationMs"],
        "stdout": kept_out,
        "stderr": kept_err,
        "stdoutTruncated": v1["stdoutTruncated"] == true || omitted_out > 0,
        "stderrTruncated": v1["stderrTruncated"] == true || omitted_err > 0,
        "stdoutOmittedBytes": omitted_out,
        "stderrOmittedBytes": omitted_err,
    });
    let text = render(&structured, base64);
    json!({
        "content": [{ "type": "text", "text": text }],
        "structuredContent": structured,
    })
}

/// The text rendering: the exit code and each stream, up to [`TEXT_OUTPUT_BYTES`] in all,
/// with a line saying where the rest is when it is not all shown.
fn render(structured: &Value, base64: bool) -> String {
    let mut text = format!("exit code {}", structured["exitCode"]);
    let streams = ["stdout", "stderr"].map(|name| {
        let truncated = structured[format!("{name}Truncated")] == true;
        let omitted = structured[format!("{name}OmittedBytes")]
            .as_u64()
            .unwrap_or(0);
        Excerpt {
            field: name,
            heading: format!("{name}{}", if truncated { " (truncated)" } else { "" }),
            all: structured[name].as_str().unwrap_or_default(),
            omitted,
        }
    });
    excerpts(&mut text, &streams, base64);
    text
}

/// A text field of a result's structured content, as its text rendering shows it.
pub(super) struct Excerpt<'a> {
    /// Its name in `structuredContent`.
    pub field: &'a str,
    /// The line above it (`--- heading ---`).
    pub heading: String,
    /// All of it, as the structured content carries it.
    pub all: &'a str,
    /// Bytes the structured content left out too (said, when not 0).
    pub omitted: u64,
}

/// Appends `fields` to `text`, each under its heading, sharing [`TEXT_OUTPUT_BYTES`] as a
/// result's streams share theirs; a field not shown whole ends with a line saying how much
/// more `structuredContent` holds. So the text a client without structured content reads
/// carries the output once, readably, and a large output is not repeated whole.
pub(super) fn excerpts(text: &mut String, fields: &[Excerpt<'_>], base64: bool) {
    let rooms = match fields {
        [a, b] => {
            let (ra, rb) = share(TEXT_OUTPUT_BYTES, json_len(a.all), json_len(b.all));
            vec![ra, rb]
        }
        _ => vec![TEXT_OUTPUT_BYTES / fields.len().max(1); fields.len()],
    };
    for (f, room) in fields.iter().zip(rooms) {
        text.push_str(&format!("\n--- {} ---\n", f.heading));
        let shown = prefix(f.all, room, base64);
        text.push_str(shown);
        let unit = if base64 { "base64 characters" } else { "bytes" };
        if shown.len() < f.all.len() {
            text.push_str(&format!(
                "\n[… {} more {unit} in structuredContent.{}]",
                f.all.len() - shown.len(),
                f.field
            ));
        }
        if f.omitted > 0 {
            text.push_str(&format!(
                "\n[… {} more bytes of {} left out of this result]",
                f.omitted, f.field
            ));
        }
    }
}

/// The length of `s` as the content of a JSON string, as serde_json writes it: `"` and `\`
/// and the control characters with a short escape take 2 bytes, other control characters 6
/// (`\u0001`), everything else its UTF-8 length (serde_json does not escape the rest).
pub(super) fn json_len(s: &str) -> usize {
    s.bytes().map(escaped_len).sum()
}

fn escaped_len(b: u8) -> usize {
    match b {
        b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
        0..=0x1f => 6,
        _ => 1,
    }
}

/// The longest start of `s` whose [`json_len`] is at most `room`, ending on a character
/// (for base64, on a whole 4-character group, so it still decodes).
fn prefix(s: &str, room: usize, base64: bool) -> &str {
    let mut used = 0;
    let mut end = s.len();
    for (i, b) in s.bytes().enumerate() {
        used += escaped_len(b);
        if used > room {
            end = i;
            break;
        }
    }
    if base64 {
        end -= end % 4;
    }
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `room` shared between two streams needing `a` and `b`: both in full when they fit; else
/// the one needing less than half in full and the rest to the other; else half each.
fn share(room: usize, a: usize, b: usize) -> (usize, usize) {
    let half = room / 2;
    if a + b <= room {
        (a, b)
    } else if a <= half {
        (a, room - a)
    } else if b <= half {
        (room - b, b)
    } else {
        (half, room - half)
    }
}

/// The number of bytes the base64 text `s` decodes to (`s` is whole groups of 4).
pub(super) fn decoded_len(s: &str) -> usize {
    let pad = s.bytes().rev().take(2).filter(|b| *b == b'=').count();
    (s.len() / 4 * 3).saturating_sub(pad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn v1(out: &str, err: &str, truncated: bool) -> Value {
        json!({
            "exitCode": 0, "durationMs": 12, "stdout": out, "stderr": err,
            "stdoutTruncated": truncated, "stderrTruncated": truncated,
        })
    }

    /// The response message carrying `result`, as the SSE event `/mcp` sends (its lines).
    fn event_len(result: &Value) -> usize {
        let message = json!({ "jsonrpc": "2.0", "id": "a-client-id-of-some-length-0123456789", "result": result });
        "event: message".len() + "data: ".len() + message.to_string().len()
    }

    #[test]
    fn small_output_is_all_there_and_the_text_repeats_it() {
        let r = result(&v1("hi\n", "oops\n", false), false);
        let s = &r["structuredContent"];
        assert_eq!(s["stdout"], "hi\n");
        assert_eq!(s["stderr"], "oops\n");
        assert_eq!(s["stdoutTruncated"], false);
        assert_eq!(s["stdoutOmittedBytes"], 0);
        assert_eq!(
            r["content"][0]["text"],
            "exit code 0\n--- stdout ---\nhi\n\n--- stderr ---\noops\n"
        );
    }

    #[test]
    fn the_worst_output_v1_keeps_fits_one_sse_event() {
        let mib = 1024 * 1024;
        let b64 = base64::engine::general_purpose::STANDARD;
        let cases: Vec<(&str, String, String, bool)> = vec![
            ("plain", "a".repeat(mib), "b".repeat(mib), false),
            ("control", "\u{1}".repeat(mib), "\u{2}".repeat(mib), false),
            ("quotes", "\"".repeat(mib), "\\".repeat(mib), false),
            (
                "invalid utf-8",
                "\u{fffd}".repeat(mib),
                "\u{fffd}".repeat(mib),
                false,
            ),
            ("4-byte", "😀".repeat(mib / 4), "x".repeat(10), false),
            (
                "base64",
                b64.encode(vec![1u8; mib]),
                b64.encode(vec![2u8; mib]),
                true,
            ),
            ("one stream", "\u{1}".repeat(mib), String::new(), false),
        ];
        for (name, out, err, base64) in cases {
            let r = result(&v1(&out, &err, true), base64);
            let len = event_len(&r);
            assert!(len <= MESSAGE_BOUND, "{name}: {len} bytes");
            let s = &r["structuredContent"];
            let kept = |f: &str| s[f].as_str().unwrap().to_owned();
            // What is kept is the start of each stream, and what is left out is counted.
            assert!(out.starts_with(&kept("stdout")), "{name}");
            assert!(err.starts_with(&kept("stderr")), "{name}");
            assert_eq!(s["stdoutTruncated"], true, "{name}");
            let omitted = s["stdoutOmittedBytes"].as_u64().unwrap() as usize;
            if base64 {
                let all = b64.decode(&out).unwrap().len();
                let shown = b64.decode(kept("stdout")).expect("whole groups").len();
                assert_eq!(shown + omitted, all, "{name}");
            } else {
                assert_eq!(kept("stdout").len() + omitted, out.len(), "{name}");
            }
            assert!(
                json_len(&kept("stdout")) + json_len(&kept("stderr")) <= RESULT_OUTPUT_BYTES,
                "{name}"
            );
            let text = r["content"][0]["text"].as_str().unwrap();
            assert!(json_len(text) <= TEXT_OUTPUT_BYTES + 1024, "{name}");
            assert!(text.contains("in structuredContent.stdout"), "{name}");
        }
    }

    #[test]
    fn a_quiet_stream_leaves_its_share_to_the_other() {
        let out = "a".repeat(900 * 1024);
        let r = result(&v1(&out, "err\n", false), false);
        let s = &r["structuredContent"];
        assert_eq!(s["stderr"], "err\n");
        assert_eq!(s["stderrTruncated"], false);
        // `err\n` is 5 bytes of JSON (`err\\n`); stdout takes the rest.
        let room = RESULT_OUTPUT_BYTES - 5;
        assert_eq!(
            s["stdout"].as_str().unwrap().len(),
            room,
            "stdout takes what stderr did not need"
        );
        assert_eq!(s["stdoutOmittedBytes"], 900 * 1024 - room);
        assert_eq!(s["stdoutTruncated"], true);
    }

    #[test]
    fn json_len_is_serde_jsons() {
        let s: String = (0u8..=0x7f)
            .map(char::from)
            .chain("é😀\u{fffd}".chars())
            .collect();
        assert_eq!(json_len(&s) + 2, serde_json::to_string(&s).unwrap().len());
    }

    #[test]
    fn a_cut_never_splits_a_character_or_a_base64_group() {
        assert_eq!(prefix("aé", 2, false), "a");
        assert_eq!(prefix("aé", 3, false), "aé");
        assert_eq!(prefix("a\u{1}b", 6, false), "a");
        assert_eq!(prefix("QUJDRA==", 7, true), "QUJD");
        assert_eq!(decoded_len("QUJDRA=="), 4);
        assert_eq!(decoded_len("QUJD"), 3);
        assert_eq!(share(10, 3, 4), (3, 4));
        assert_eq!(share(10, 2, 20), (2, 8));
        assert_eq!(share(10, 20, 20), (5, 5));
    }
}
