//! Live output: what a running process action has printed, streamed to whoever follows it.
//!
//! Zero cost when nobody follows: the reader of each output pipe (`runner::read_bounded`) keeps
//! its bounded tail in a `Capture` shared with this module instead of a buffer of its own (one
//! uncontended lock per read, no copy, no publish). Only a follow request (`FollowRequest`, on
//! the control exchange, from an API stream whose client is connected) starts a streaming task
//! for the execution, and only while a request is fresher than `FOLLOW_LEASE`: it sends each
//! follower what the capture holds from the start, then new output every `COALESCE` (complete
//! lines, or up to `MOST_PER_MESSAGE` of a longer one), each chunk with its stream and byte
//! offset, redacted as the stored output is, and at most the run's output limit per stream and
//! follower (then a `Capped` notice). When the run ends it sends the rest and an `End`.
//! Messages are transient and go to the follower's own queue through `ns.output`; nothing is
//! written to PostgreSQL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use attune_common::mq::{FOLLOW_LEASE, LiveOutput, MqError, OutputStream, Publisher};
use attune_common::secrets::Redactor;
use tokio_util::sync::CancellationToken;

/// How long new output waits to be sent with what comes after it.
pub const COALESCE: Duration = Duration::from_millis(100);
/// The most text one message carries.
pub const MOST_PER_MESSAGE: usize = 16 * 1024;

/// The bounded tail of one output stream: `kept` holds the bytes from offset `dropped` on.
#[derive(Debug, Default)]
pub struct Captured {
    pub kept: Vec<u8>,
    pub dropped: u64,
}

/// A process run's stdout and stderr as their readers keep them.
#[derive(Debug, Default)]
pub struct Capture {
    streams: [Mutex<Captured>; 2],
}

fn index(stream: OutputStream) -> usize {
    match stream {
        OutputStream::Stdout => 0,
        OutputStream::Stderr => 1,
    }
}

impl Capture {
    /// Appends what a read returned, keeping at most about twice `limit` bytes (the older ones
    /// go: the stored output is the last `limit`).
    pub fn append(&self, stream: OutputStream, bytes: &[u8], limit: usize) {
        let mut captured = self.streams[index(stream)].lock().expect("capture poisoned");
        captured.kept.extend_from_slice(bytes);
        if captured.kept.len() > limit.saturating_mul(2).max(8192) {
            let excess = captured.kept.len() - limit;
            captured.kept.drain(..excess);
            captured.dropped += excess as u64;
        }
    }

    /// The stored output: the last `limit` bytes, said so when some were left out.
    pub fn text(&self, stream: OutputStream, limit: usize) -> String {
        let captured = self.streams[index(stream)].lock().expect("capture poisoned");
        let start = captured.kept.len().saturating_sub(limit);
        let dropped = captured.dropped + start as u64;
        let text = String::from_utf8_lossy(&captured.kept[start..]);
        if dropped > 0 { format!("[... {dropped} bytes truncated]\n{text}") } else { text.into_owned() }
    }

    /// The next piece to send from `offset` on (moved up to what is still kept): its offset and
    /// bytes, at most `most` of them, cut after the last newline unless `all` (the run ended) or
    /// the line is longer than a message; never through a value `redactor` hides (a secret split
    /// between two messages would be missed by redaction, and joined again by the follower).
    pub fn next_piece(
        &self,
        stream: OutputStream,
        offset: u64,
        most: usize,
        all: bool,
        redactor: Option<&Redactor>,
    ) -> Option<(u64, Vec<u8>)> {
        let captured = self.streams[index(stream)].lock().expect("capture poisoned");
        let from = offset.max(captured.dropped);
        let start = usize::try_from(from - captured.dropped).ok()?;
        let available = captured.kept.get(start..)?;
        let length = cut(available, most, all, redactor);
        (length > 0).then(|| (from, available[..length].to_vec()))
    }
}

/// How much of `available` to send now (see `Capture::next_piece`): never within a UTF-8
/// character, nor through a secret.
pub fn cut(available: &[u8], most: usize, all: bool, redactor: Option<&Redactor>) -> usize {
    let whole = all && available.len() <= most;
    let window = &available[..available.len().min(most)];
    let mut end = if whole {
        available.len()
    } else if let Some(newline) = window.iter().rposition(|&b| b == b'\n') {
        newline + 1
    } else if window.len() < most {
        return 0; // a line still being written
    } else {
        window.len()
    };
    if let Some(redactor) = redactor {
        let safe = redactor.cut_before(available, end, !all);
        // a secret longer than a message cannot be kept whole (it is redacted in the stored output)
        if safe > 0 || whole {
            end = safe;
        }
    }
    while end > 0 && end < available.len() && (available[end] & 0b1100_0000) == 0b1000_0000 {
        end -= 1;
    }
    end
}

/// One follower of a run: how far it has been sent each stream, and until when it follows.
#[derive(Debug)]
struct Follower {
    until: Instant,
    sent: [u64; 2],
    streamed: [u64; 2],
    capped: [bool; 2],
}

/// A process run that can be followed.
pub struct LiveRun {
    pub execution_id: i64,
    pub capture: Arc<Capture>,
    redactor: Option<Redactor>,
    /// Bytes streamed per stream and follower at most (the run's output limit).
    limit: u64,
    /// Fires when the run has ended: the last output is sent, then `End`.
    pub ended: CancellationToken,
    /// The followers and whether a streaming task runs for them, under one lock.
    followers: Mutex<(HashMap<String, Follower>, bool)>,
}

impl LiveRun {
    pub fn new(execution_id: i64, redactor: Option<Redactor>, limit: usize) -> Arc<LiveRun> {
        Arc::new(LiveRun {
            execution_id,
            capture: Arc::default(),
            redactor: redactor.filter(|redactor| !redactor.is_empty()),
            limit: limit as u64,
            ended: CancellationToken::new(),
            followers: Mutex::default(),
        })
    }

    /// A follow request (new, or the renewal of a lease): true if a streaming task must start.
    /// A new follower is sent the run's output from the start of what is kept.
    pub fn follow(&self, follower: &str, now: Instant) -> bool {
        let mut followers = self.followers.lock().expect("followers poisoned");
        if followers.0.len() >= MOST_FOLLOWERS && !followers.0.contains_key(follower) {
            return false;
        }
        followers
            .0
            .entry(follower.to_string())
            .or_insert(Follower { until: now, sent: [0; 2], streamed: [0; 2], capped: [false; 2] })
            .until = now + FOLLOW_LEASE;
        !std::mem::replace(&mut followers.1, true)
    }

    /// The followers whose lease holds at `now` (the others are forgotten); none: the
    /// streaming task stops (and the next request starts another).
    fn fresh(&self, now: Instant, ended: bool) -> Vec<String> {
        let mut followers = self.followers.lock().expect("followers poisoned");
        followers.0.retain(|_, follower| follower.until > now || ended);
        let names: Vec<String> = followers.0.keys().cloned().collect();
        if names.is_empty() || ended {
            if ended {
                followers.0.clear();
            }
            followers.1 = false;
        }
        names
    }

    fn forget(&self, follower: &str) {
        self.followers.lock().expect("followers poisoned").0.remove(follower);
    }

    /// The messages due to `follower` now, each with the offset it advances the stream to.
    fn due(&self, follower: &str, all: bool) -> Vec<(LiveOutput, OutputStream, u64, u64)> {
        let followers = self.followers.lock().expect("followers poisoned");
        let Some(state) = followers.0.get(follower) else { return Vec::new() };
        let (sent, streamed, capped) = (state.sent, state.streamed, state.capped);
        drop(followers);
        let mut due = Vec::new();
        for stream in [OutputStream::Stdout, OutputStream::Stderr] {
            let i = index(stream);
            if capped[i] {
                continue;
            }
            let (mut offset, mut streamed) = (sent[i], streamed[i]);
            loop {
                let room = self.limit.saturating_sub(streamed) as usize;
                let most = MOST_PER_MESSAGE.min(room);
                if most == 0 {
                    let capped = LiveOutput::Capped { execution_id: self.execution_id, stream, limit: self.limit };
                    due.push((capped, stream, offset, u64::MAX));
                    break;
                }
                let Some((from, bytes)) = self.capture.next_piece(stream, offset, most, all, self.redactor.as_ref())
                else {
                    break;
                };
                let length = bytes.len() as u64;
                let text = String::from_utf8_lossy(&bytes);
                let text = match &self.redactor {
                    Some(redactor) => redactor.text(&text),
                    None => text.into_owned(),
                };
                offset = from + length;
                streamed += length;
                let chunk = LiveOutput::Chunk { execution_id: self.execution_id, stream, offset: from, length, text };
                due.push((chunk, stream, offset, length));
            }
        }
        due
    }

    fn sent(&self, follower: &str, stream: OutputStream, offset: u64, length: u64) {
        let mut followers = self.followers.lock().expect("followers poisoned");
        if let Some(state) = followers.0.get_mut(follower) {
            let i = index(stream);
            if length == u64::MAX {
                state.capped[i] = true;
            } else {
                state.sent[i] = offset;
                state.streamed[i] += length;
            }
        }
    }
}

/// The most followers one run streams to at once (a flood of forged follow requests costs a
/// bounded number of publishes).
pub const MOST_FOLLOWERS: usize = 32;

/// Streams `run` to its followers until none is left or the run has ended (see the module's
/// documentation).
pub async fn stream(run: Arc<LiveRun>, publisher: &Publisher) {
    let exchange = publisher.topology().output_exchange();
    loop {
        let ended = tokio::select! {
            _ = run.ended.cancelled() => true,
            _ = tokio::time::sleep(COALESCE) => false,
        };
        let followers = run.fresh(Instant::now(), false);
        if followers.is_empty() {
            return;
        }
        for follower in &followers {
            for (message, stream, offset, length) in run.due(follower, ended) {
                let payload = serde_json::to_vec(&message).expect("live output serializes");
                match publisher.publish_transient(&exchange, follower, &payload).await {
                    Ok(()) => run.sent(follower, stream, offset, length),
                    Err(MqError::Unroutable(_)) => {
                        // its queue is gone: the follower left
                        run.forget(follower);
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(execution_id = run.execution_id, error = %e, "live output not sent");
                        break;
                    }
                }
            }
            if ended {
                let end = serde_json::to_vec(&LiveOutput::End { execution_id: run.execution_id }).expect("serializes");
                let _ = publisher.publish_transient(&exchange, follower, &end).await;
            }
        }
        if ended {
            run.fresh(Instant::now(), true);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_sends_whole_lines_and_a_long_line_in_pieces() {
        assert_eq!(cut(b"one\ntwo\nthr", 100, false, None), 8, "up to the last newline");
        assert_eq!(cut(b"partial", 100, false, None), 0, "a line still being written waits");
        assert_eq!(cut(b"partial", 100, true, None), 7, "the run ended: all of it");
        assert_eq!(cut(b"abcdefgh", 4, false, None), 4, "a line longer than a message");
        assert_eq!(cut("aé".as_bytes(), 2, false, None), 1, "never within a character");
        assert_eq!(cut(b"ab\ncdefgh", 4, true, None), 3, "the run ended, more than a message: lines first");
        let secret = Redactor::new(vec!["s3cr3t".into()]);
        let secret = Some(&secret);
        // a secret across the cut of a long line waits whole for the next message
        assert_eq!(cut(b"xxxxxxxs3cr3tyyyy", 10, false, secret), 7, "a secret the cut would split");
        assert_eq!(cut(b"xxxxxxxxxxs3c", 10, false, secret), 10, "a secret after the cut");
        assert_eq!(cut(b"xxxxxxxxs3", 20, false, None), 0, "a line being written");
        assert_eq!(cut(b"xxxxxxxxxxxxxs3", 15, false, secret), 13, "the start of a secret at the end waits");
        assert_eq!(cut(b"xxxxxxxxxxxxxs3", 15, true, secret), 15, "the run ended: nothing more comes");
        assert_eq!(cut(b"xxs3cr3t\nyy", 20, false, secret), 9, "a whole line with its secret");
    }

    #[test]
    fn the_capture_keeps_a_bounded_tail_and_its_offsets() {
        let capture = Capture::default();
        for n in 0..5000 {
            capture.append(OutputStream::Stdout, format!("line-{n}\n").as_bytes(), 1024);
        }
        let text = capture.text(OutputStream::Stdout, 1024);
        assert!(text.starts_with("[... ") && text.ends_with("line-4999\n"), "{}", &text[..40]);
        // a follower that starts late starts from what is kept
        let (from, bytes) = capture.next_piece(OutputStream::Stdout, 0, 1 << 20, false, None).unwrap();
        assert!(from > 0 && bytes.ends_with(b"line-4999\n"));
        assert!(capture.next_piece(OutputStream::Stderr, 0, 100, true, None).is_none());
    }

    #[test]
    fn a_follower_is_sent_each_byte_once_up_to_the_limit_then_a_capped_notice() {
        let run = LiveRun::new(7, None, 10);
        let now = Instant::now();
        assert!(run.follow("f", now), "the first request starts the streaming");
        assert!(!run.follow("f", now), "a renewal does not start another");
        run.capture.append(OutputStream::Stdout, b"abc\nde", 1000);
        let due = run.due("f", false);
        assert_eq!(due.len(), 1);
        let (LiveOutput::Chunk { offset, text, .. }, stream, to, length) = &due[0] else { panic!("{due:?}") };
        assert_eq!((*offset, text.as_str()), (0, "abc\n"));
        run.sent("f", *stream, *to, *length);
        assert!(run.due("f", false).is_empty(), "nothing new");
        run.capture.append(OutputStream::Stdout, b"fghijklmn\n", 1000);
        let due = run.due("f", true);
        let texts: Vec<_> = due.iter().map(|(m, ..)| m.clone()).collect();
        assert!(matches!(&texts[0], LiveOutput::Chunk { offset: 4, text, .. } if text == "defghi"), "{texts:?}");
        assert!(matches!(texts[1], LiveOutput::Capped { limit: 10, .. }), "{texts:?}");
        // leases run out
        assert_eq!(run.fresh(now + FOLLOW_LEASE + Duration::from_secs(1), false), Vec::<String>::new());
        assert!(run.follow("g", now), "a new request after the task stopped starts another");
    }

    #[test]
    fn live_output_is_redacted_and_a_secret_is_not_split() {
        let run = LiveRun::new(7, Some(Redactor::new(vec!["hunter2".into()])), 1 << 20);
        run.follow("f", Instant::now());
        let long = format!("{}hunter2", "x".repeat(MOST_PER_MESSAGE - 3));
        run.capture.append(OutputStream::Stderr, long.as_bytes(), 1 << 20);
        run.capture.append(OutputStream::Stderr, b"\n", 1 << 20);
        let texts: String = run
            .due("f", true)
            .into_iter()
            .filter_map(|(m, ..)| match m {
                LiveOutput::Chunk { text, .. } => Some(text),
                _ => None,
            })
            .collect();
        assert!(!texts.contains("hunter2") && texts.ends_with("[redacted]\n"), "{}", &texts[texts.len() - 30..]);
    }
}
