//! `attune execution tail ID`: follows `GET /api/v1/executions/{id}/output` (Server-Sent Events)
//! and prints each `stdout` chunk on stdout and each `stderr` chunk on stderr as it comes.
//!
//! What an action printed reaches the operator's terminal: its control characters (an escape
//! sequence could move the cursor, rewrite what was shown, set the window's title or, on some
//! terminals, answer with keystrokes) are shown escaped, `\x1b`, but for newline, tab and a
//! carriage return before a newline; `--raw` prints the bytes as they came.
//!
//! A stream the API ends at one of its bounds (`ATTUNE_API_OUTPUT_STREAM_MAX_SECS`, or
//! `ATTUNE_API_OUTPUT_STREAM_IDLE_SECS` with nothing sent: `closed` with `open_again`) is opened
//! again where it was (`stdout_from`, `stderr_from`: nothing is printed twice), so a long or
//! quiet action is followed to its end.
//!
//! Exit status: 0 when the execution completed, 2 when it ended otherwise (failed, timeout,
//! canceled, abandoned), 1 for an API error or a stream that ended before the execution did and
//! is not to be opened again (the API stopping; run it again), or one refused
//! (`429 too_many_streams`).

use std::io::Write;

use anyhow::anyhow;
use serde_json::Value;

use crate::client::Client;

/// One Server-Sent Event: its name (`message` when it has none) and its data lines joined.
#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

/// Splits a byte stream into events as they complete (the format of the SSE specification:
/// lines of `field: value`, an empty line ends an event, `:` starts a comment).
#[derive(Debug, Default)]
pub struct SseParser {
    buffer: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
}

impl SseParser {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(newline) = self.buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=newline).collect();
            let line = String::from_utf8_lossy(&line[..line.len() - 1]);
            let line = line.strip_suffix('\r').unwrap_or(&line);
            if line.is_empty() {
                if !self.data.is_empty() || self.event.is_some() {
                    events.push(SseEvent {
                        event: self.event.take().unwrap_or_else(|| "message".into()),
                        data: std::mem::take(&mut self.data).join("\n"),
                    });
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => self.event = Some(value.to_string()),
                "data" => self.data.push(value.to_string()),
                _ => {}
            }
        }
        events
    }
}

/// What an `end` event says about the exit status.
pub fn exit_status(end: &Value) -> i32 {
    if end["status"] == "completed" { 0 } else { 2 }
}

/// `text` with its control characters shown escaped: C0 and DEL as `\x1b`, C1 as `\u{9b}`;
/// newline, tab and a carriage return before a newline are left as they are.
pub fn escaped(text: &str) -> std::borrow::Cow<'_, str> {
    let mut chars = text.chars().peekable();
    let kept = |c: char, next: Option<&char>| c == '\n' || c == '\t' || (c == '\r' && next == Some(&'\n'));
    if !text.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 16);
    while let Some(c) = chars.next() {
        if !c.is_control() || kept(c, chars.peek()) {
            shown.push(c);
        } else if (c as u32) < 0x80 {
            shown.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            shown.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    std::borrow::Cow::Owned(shown)
}

/// Follows execution `id` until its stream ends; `json`: each event as one JSON line on stdout;
/// `raw`: the output as it came, control characters included.
pub async fn tail(client: &Client, id: i64, json: bool, raw: bool) -> anyhow::Result<i32> {
    let show = |data: &Value| -> String {
        let text = data["text"].as_str().unwrap_or_default();
        if raw { text.to_string() } else { escaped(text).into_owned() }
    };
    // where each stream is: the `next` of its last chunk, to open the stream again from
    let mut from = [0u64; 2];
    'open: loop {
        let path = match from {
            [0, 0] => format!("/api/v1/executions/{id}/output"),
            [stdout, stderr] => format!("/api/v1/executions/{id}/output?stdout_from={stdout}&stderr_from={stderr}"),
        };
        let mut response = match client.open_stream(&path).await {
            // a stream opened again: a connection the API just closed may be the one tried first
            Err(error) if from != [0, 0] && crate::client::unanswered(&error) => client.open_stream(&path).await?,
            opened => opened?,
        };
        let mut parser = SseParser::default();
        while let Some(bytes) = response.chunk().await? {
            for event in parser.push(&bytes) {
                let data: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
                if let (Some(i), Some(next)) = (stream_index(&event.event), data["next"].as_u64()) {
                    from[i] = from[i].max(next);
                }
                if json {
                    crate::say!("{}", serde_json::json!({"event": event.event, "data": data}));
                }
                match event.event.as_str() {
                    "stdout" if !json => {
                        let mut out = std::io::stdout().lock();
                        out.write_all(show(&data).as_bytes())?;
                        out.flush()?;
                    }
                    "stderr" if !json => {
                        let mut err = std::io::stderr().lock();
                        err.write_all(show(&data).as_bytes())?;
                        err.flush()?;
                    }
                    "skipped" if !json => {
                        eprintln!("[attune: {} bytes of {} not shown]", data["bytes"], text(&data["stream"]))
                    }
                    "waiting" if !json => eprintln!("[attune: waiting: {}]", text(&data["message"])),
                    "capped" if !json => eprintln!(
                        "[attune: no more {} live past {} bytes; the stored tail: attune execution get {id}]",
                        text(&data["stream"]),
                        data["limit_bytes"]
                    ),
                    "end" => {
                        if !json {
                            eprintln!(
                                "[attune: execution {id} {}{}]",
                                text(&data["status"]),
                                data["exit_code"]
                                    .as_i64()
                                    .map(|code| format!(", exit code {code}"))
                                    .unwrap_or_default()
                            );
                        }
                        return Ok(exit_status(&data));
                    }
                    "closed" if data["open_again"] == true => {
                        if !json {
                            eprintln!("[attune: {}; following again]", text(&data["reason"]));
                        }
                        continue 'open;
                    }
                    "closed" => {
                        if !json {
                            eprintln!("[attune: the stream ended before the execution: {}]", text(&data["reason"]));
                        }
                        return Ok(1);
                    }
                    _ => {}
                }
            }
        }
        return Err(anyhow!("the stream of execution {id} ended without its end (the connection was lost)"));
    }
}

/// The index of an output event's stream (`stdout` 0, `stderr` 1).
fn stream_index(event: &str) -> Option<usize> {
    match event {
        "stdout" => Some(0),
        "stderr" => Some(1),
        _ => None,
    }
}

fn text(value: &Value) -> String {
    value.as_str().map_or_else(|| value.to_string(), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_escaped_but_lines_and_tabs() {
        assert_eq!(escaped("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(escaped("50%\r75%"), "50%\\x0d75%", "a carriage return alone");
        assert_eq!(escaped("a\x1b]0;owned\x07b\r\n"), "a\\x1b]0;owned\\x07b\r\n", "an OSC title and a bell");
        assert_eq!(escaped("50%\r75%\x1b[2K\x7f"), "50%\\x0d75%\\x1b[2K\\x7f", "a carriage return alone, DEL");
        assert_eq!(escaped("\u{9b}31m é"), "\\u{9b}31m é", "a C1 control; other text as it is");
    }

    #[test]
    fn events_are_read_as_they_complete_whatever_the_chunks() {
        let mut parser = SseParser::default();
        let stream = ": keep-alive\n\nevent: stdout\ndata: {\"offset\":0,\ndata: \"text\":\"a\\n\"}\n\nevent: end\r\ndata: {}\r\n\r\n";
        let mut events = Vec::new();
        for piece in stream.as_bytes().chunks(5) {
            events.extend(parser.push(piece));
        }
        assert_eq!(
            events,
            vec![
                SseEvent { event: "stdout".into(), data: "{\"offset\":0,\n\"text\":\"a\\n\"}".into() },
                SseEvent { event: "end".into(), data: "{}".into() },
            ]
        );
        let chunk: Value = serde_json::from_str(&events[0].data).unwrap();
        assert_eq!(chunk["text"], "a\n");
    }

    #[test]
    fn the_exit_status_says_whether_it_completed() {
        assert_eq!(exit_status(&serde_json::json!({"status": "completed", "exit_code": 0})), 0);
        for status in ["failed", "timeout", "canceled", "abandoned"] {
            assert_eq!(exit_status(&serde_json::json!({"status": status})), 2, "{status}");
        }
    }
}
