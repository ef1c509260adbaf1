//! Secrets: values actions need that nobody reads back.
//!
//! - The store (`db::secret`): an `admin` sets a named secret (`PUT /api/v1/secrets/{name}`,
//!   `attune secret set`); its value is sealed (AES-256-GCM, the secret's name bound in as
//!   associated data) with the key the operator provides in `ATTUNE_SECRETS_KEY_FILE` before it
//!   reaches the database, and no route or command answers it.
//! - References: a parameter whose value is `{"$secret": "<name>"}` (submitted, or an action's
//!   `default`) stands for that secret; an HTTP action's headers, URL and body take it like any
//!   parameter. The reference, not the value, is what is stored and shown.
//! - Secret parameters: a parameter declared `secret: true` is sealed by the API at submission
//!   (`{"$sealed": "<hex>"}` in the record) and shown as `[redacted]` in every answer.
//! - At run time the worker opens both forms (`Opened`), hands the action the values, and
//!   redacts every one of them from what it records: stdout, stderr, the result, the error.
//!
//! A single-key object `{"$secret": ...}` or `{"$sealed": ...}` is therefore never a parameter's
//! own value.

use std::path::Path;
use std::sync::Arc;

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::{Map, Value};

use crate::config::{ConfigError, Source, read_optional};

pub const KEY_FILE: &str = "ATTUNE_SECRETS_KEY_FILE";
/// Keys that open what an earlier key sealed, while the key is rotated (comma-separated files).
pub const PREVIOUS_KEY_FILES: &str = "ATTUNE_SECRETS_PREVIOUS_KEY_FILES";
/// What stands in a record or an answer for a secret value.
pub const REDACTED: &str = "[redacted]";
pub use attune_core::params::{SEALED_KEY, SECRET_KEY};

/// The operator's key: seals and opens secret values; while it is rotated, the previous keys
/// open what they sealed (`ATTUNE_SECRETS_PREVIOUS_KEY_FILES`) and seal nothing.
#[derive(Clone)]
pub struct Sealer {
    key: Arc<LessSafeKey>,
    previous: Arc<Vec<LessSafeKey>>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

/// A sealed value that does not open with this key (another key, or altered).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a sealed value does not open with this key (sealed with another ATTUNE_SECRETS_KEY_FILE, or altered)")]
pub struct Unopenable;

impl Sealer {
    /// `ATTUNE_SECRETS_KEY_FILE`, if set: a file holding 32 random bytes as 64 hex digits (make
    /// one with `od -An -N32 -tx1 /dev/urandom | tr -d ' \n'`); errors name the setting and file.
    /// With `ATTUNE_SECRETS_PREVIOUS_KEY_FILES` (files of the same form, comma-separated), the
    /// keys that open what they sealed before this one (see "Rotating the key" in the book's
    /// security page); it needs `ATTUNE_SECRETS_KEY_FILE`.
    pub fn from_source(source: &dyn Source) -> Result<Option<Sealer>, ConfigError> {
        let previous = read_optional(source, PREVIOUS_KEY_FILES).filter(|p| !p.trim().is_empty());
        let Some(path) = read_optional(source, KEY_FILE) else {
            return match previous {
                Some(previous) => Err(ConfigError {
                    name: PREVIOUS_KEY_FILES.into(),
                    value: previous,
                    reason: format!("previous keys open only beside the key in force: set {KEY_FILE} too"),
                }),
                None => Ok(None),
            };
        };
        let mut sealer = Sealer::from_key(&read_key(KEY_FILE, &path)?);
        let previous: Vec<LessSafeKey> = previous
            .iter()
            .flat_map(|files| files.split(','))
            .map(str::trim)
            .filter(|file| !file.is_empty())
            .map(|file| read_key(PREVIOUS_KEY_FILES, file).map(|bytes| aes_key(&bytes)))
            .collect::<Result<_, _>>()?;
        sealer.previous = Arc::new(previous);
        Ok(Some(sealer))
    }

    pub fn from_key(key: &[u8]) -> Sealer {
        Sealer { key: Arc::new(aes_key(key)), previous: Arc::new(Vec::new()) }
    }

    /// This sealer, also opening what `previous` sealed.
    pub fn with_previous(mut self, previous: &[&[u8]]) -> Sealer {
        self.previous = Arc::new(previous.iter().map(|key| aes_key(key)).collect());
        self
    }

    /// Whether `sealed` opens with the key in force (not only with a previous one).
    pub fn sealed_with_current(&self, context: &str, sealed: &[u8]) -> bool {
        open_with(&self.key, context, sealed).is_ok()
    }

    /// `plaintext` sealed for `context` (a secret's name, or `parameter`): nonce then ciphertext.
    pub fn seal(&self, context: &str, plaintext: &str) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).expect("the system's random source");
        let mut sealed = plaintext.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(context.as_bytes()), &mut sealed)
            .expect("sealing a value in memory");
        [nonce.as_slice(), &sealed].concat()
    }

    /// `sealed` opened with the key in force, else with a previous one.
    pub fn open(&self, context: &str, sealed: &[u8]) -> Result<String, Unopenable> {
        std::iter::once(self.key.as_ref())
            .chain(self.previous.iter())
            .find_map(|key| open_with(key, context, sealed).ok())
            .ok_or(Unopenable)
    }

    /// A sealed parameter value (`{"$sealed": hex}` of `name` of `action_ref`) sealed again with
    /// the key in force; `None` when it is sealed with it already, `Err` when no key opens it.
    pub fn reseal_parameter(&self, action_ref: &str, name: &str, value: &Value) -> Result<Option<Value>, Unopenable> {
        let Some(bytes) = sealed(value) else { return Ok(None) };
        let bytes = bytes.ok_or(Unopenable)?;
        let context = parameter_context(action_ref, name);
        if self.sealed_with_current(&context, &bytes) {
            return Ok(None);
        }
        let plain = self.open(&context, &bytes)?;
        Ok(Some(self.seal_parameter(action_ref, name, &plain)))
    }

    /// A secret parameter's value as the record keeps it: `{"$sealed": "<hex>"}`, sealed for
    /// that parameter of that action (a value copied into another parameter or action does not
    /// open).
    pub fn seal_parameter(&self, action_ref: &str, name: &str, plaintext: &str) -> Value {
        let mut sealed = Map::new();
        let context = parameter_context(action_ref, name);
        sealed.insert(SEALED_KEY.into(), Value::String(to_hex(&self.seal(&context, plaintext))));
        Value::Object(sealed)
    }
}

fn aes_key(key: &[u8]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("an AES-256 key is 32 bytes"))
}

/// The key in file `path` (setting `name`): 32 bytes as 64 hex digits; errors name both.
fn read_key(name: &str, path: &str) -> Result<Vec<u8>, ConfigError> {
    let path = path.trim().to_string();
    let error = |reason: String| ConfigError { name: name.into(), value: path.clone(), reason };
    let text = std::fs::read_to_string(Path::new(&path)).map_err(|e| error(format!("cannot read it: {e}")))?;
    from_hex(text.trim())
        .filter(|bytes| bytes.len() == 32)
        .ok_or_else(|| error("must hold 32 bytes as 64 hex digits (od -An -N32 -tx1 /dev/urandom)".into()))
}

fn open_with(key: &LessSafeKey, context: &str, sealed: &[u8]) -> Result<String, Unopenable> {
    if sealed.len() < NONCE_LEN {
        return Err(Unopenable);
    }
    let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| Unopenable)?;
    let mut buffer = ciphertext.to_vec();
    let opened = key.open_in_place(nonce, Aad::from(context.as_bytes()), &mut buffer).map_err(|_| Unopenable)?;
    String::from_utf8(opened.to_vec()).map_err(|_| Unopenable)
}

/// The associated data of a sealed parameter: the action's ref and the parameter's name.
fn parameter_context(action_ref: &str, name: &str) -> String {
    format!("parameter\u{0}{action_ref}\u{0}{name}")
}

/// Whether `parameters` hold a value only the key opens (a reference or a sealed value, at the
/// top level): what the database's `parameters_need_key` says, for a claim made here.
pub fn needs_key(parameters: &Value) -> bool {
    parameters.as_object().is_some_and(|given| {
        given
            .values()
            .any(|value| value.as_object().is_some_and(|o| o.contains_key(SECRET_KEY) || o.contains_key(SEALED_KEY)))
    })
}

/// The name `value` refers to, when it is a reference `{"$secret": "<name>"}`.
pub fn reference(value: &Value) -> Option<&str> {
    attune_core::params::secret_reference(value)
}

/// The sealed bytes `value` holds, when it is `{"$sealed": "<hex>"}`.
fn sealed(value: &Value) -> Option<Option<Vec<u8>>> {
    let object = value.as_object().filter(|o| o.len() == 1)?;
    Some(object.get(SEALED_KEY)?.as_str().and_then(from_hex))
}

/// `parameters` as an answer shows them: each sealed value as `[redacted]` (references stay:
/// they name a secret, they are not one).
pub fn shown(parameters: &mut Value) {
    if let Some(parameters) = parameters.as_object_mut() {
        for value in parameters.values_mut() {
            if sealed(value).is_some() {
                *value = Value::String(REDACTED.into());
            }
        }
    }
}

/// Serializes parameters as `shown` makes them (for `db::execution::Execution`).
pub fn serialize_shown<S: serde::Serializer>(parameters: &Value, serializer: S) -> Result<S::Ok, S::Error> {
    if !parameters.as_object().is_some_and(|given| given.values().any(|v| sealed(v).is_some())) {
        return serde::Serialize::serialize(parameters, serializer);
    }
    let mut shown_parameters = parameters.clone();
    shown(&mut shown_parameters);
    serde::Serialize::serialize(&shown_parameters, serializer)
}

/// The parameters with every secret opened, and what to redact from what the run produces.
#[derive(Debug, Default)]
pub struct Opened {
    pub parameters: Value,
    pub redactor: Redactor,
}

/// Why an action could not get its parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum Unopened {
    /// A secret not set, no key, a value that does not open: the parameters are wrong
    /// (`invalid_parameters`).
    Invalid(String),
    /// The store could not be read (the database away for longer than the few tries given it):
    /// nothing is wrong with the parameters (`transient_error`).
    Unavailable(String),
}

impl From<String> for Unopened {
    fn from(reason: String) -> Self {
        Unopened::Invalid(reason)
    }
}

/// How often, and after what waits, a read of the secret store that failed for a reason that
/// passes (`db::is_transient`) is tried again before the run ends `transient_error`.
const STORE_RETRIES: [std::time::Duration; 3] = [
    std::time::Duration::from_millis(200),
    std::time::Duration::from_millis(500),
    std::time::Duration::from_millis(1_000),
];

/// Opens the references and sealed values among `parameters` (top-level values) of the execution
/// `execution_id`, reading the named secrets from the store (those its parameters refer to); `None` when there are none (the parameters run as they are, not
/// copied). `Err`: why the action cannot get its parameters: `Unopened::Invalid` (a secret not
/// set, no key, a value that does not open), or `Unopened::Unavailable` (the store could not be
/// read, after a few tries). Each value opened is checked against its parameter's declaration
/// (the action's, read with the secrets), as a value given plainly is by the API
/// (`check_opened`): a reference skips that check at submission.
pub async fn open(
    db: &sqlx::PgPool,
    sealer: Option<&Sealer>,
    execution_id: i64,
    action_ref: &str,
    parameters: &Value,
) -> Result<Option<Opened>, Unopened> {
    let Some(given) = parameters.as_object() else {
        return Ok(None);
    };
    let names: Vec<String> = given.values().filter_map(reference).map(str::to_string).collect();
    let has_sealed = given.values().any(|v| sealed(v).is_some());
    if names.is_empty() && !has_sealed {
        return Ok(None);
    }
    let sealer = sealer
        .ok_or_else(|| format!("this worker has no {KEY_FILE}: it cannot open the secrets among the parameters"))?;
    let mut waits = STORE_RETRIES.iter();
    let read = || async {
        let stored = crate::db::secret::sealed_values(db, execution_id, &names).await?;
        Ok::<_, sqlx::Error>((stored, crate::db::action::declared_parameters(db, action_ref).await?))
    };
    let (stored, specs) = loop {
        match read().await {
            Ok(read) => break read,
            Err(e) if crate::db::is_transient(&e) => match waits.next() {
                Some(wait) => {
                    tracing::warn!(execution_id, error = %e, retry_in_ms = wait.as_millis() as u64, "reading secrets failed; trying again");
                    tokio::time::sleep(*wait).await;
                }
                None => return Err(Unopened::Unavailable(format!("reading secrets: {e}"))),
            },
            Err(e) => return Err(Unopened::Invalid(format!("reading secrets: {e}"))),
        }
    };
    let mut opened = Map::new();
    let mut values = Vec::new();
    for (name, value) in given {
        let plain = if let Some(secret) = reference(value) {
            let (_, bytes) = stored.iter().find(|(stored, _)| stored == secret).ok_or_else(|| {
                format!("parameter '{name}': the secret '{secret}' is not set, or not for {action_ref}")
            })?;
            let plain =
                sealer.open(secret, bytes).map_err(|e| format!("parameter '{name}': secret '{secret}': {e}"))?;
            Some(plain)
        } else if let Some(bytes) = sealed(value) {
            let bytes = bytes.ok_or_else(|| format!("parameter '{name}': its sealed value is not hex"))?;
            let context = parameter_context(action_ref, name);
            Some(sealer.open(&context, &bytes).map_err(|e| format!("parameter '{name}': {e}"))?)
        } else {
            None
        };
        if let Some(plain) = &plain
            && let Some(spec) = specs.as_ref().and_then(|specs| specs.get(name))
            && let Ok(spec) = serde_json::from_value::<attune_core::params::ParamSpec>(spec.clone())
        {
            attune_core::params::check_opened(name, &spec, plain).map_err(|e| e.to_string())?;
        }
        match plain {
            Some(plain) => {
                values.push(plain.clone());
                opened.insert(name.clone(), Value::String(plain));
            }
            None => {
                opened.insert(name.clone(), value.clone());
            }
        }
    }
    Ok(Some(Opened { parameters: Value::Object(opened), redactor: Redactor::new(values) }))
}

/// Replaces secret values wherever they appear in what a run produced, and every piece of one of
/// `PIECE` bytes or more: output cut to its tail (or a live stream that dropped bytes) may begin
/// or end inside a value, and an action may print a part of one. Each run of the text that such
/// pieces cover is replaced whole by [`REDACTED`]; a value shorter than `PIECE` only where it
/// appears whole.
#[derive(Debug, Default, Clone)]
pub struct Redactor {
    /// Each value in each of its forms, longest first.
    values: Vec<String>,
    /// Every `PIECE`-byte window of every form of `PIECE` bytes or more.
    windows: std::collections::HashSet<[u8; PIECE]>,
    /// Every part shorter than `PIECE` of every form (`short_key`).
    short_parts: std::collections::HashSet<u64>,
}

/// A part of fewer than `PIECE` bytes as one number: its bytes, and its length in the top byte.
fn short_key(part: &[u8]) -> u64 {
    part.iter().fold((part.len() as u64) << 56, |key, byte| (key << 8) | u64::from(*byte))
}

/// The shortest piece of a value that is redacted wherever it appears.
pub const PIECE: usize = 8;

impl Redactor {
    /// Redacts each of `values` as it is, and as it appears JSON-escaped (a script that prints
    /// JSON) and URL-encoded (an HTTP action's URL in its error).
    pub fn new(given: Vec<String>) -> Redactor {
        let mut values = Vec::new();
        for value in given {
            let escaped = serde_json::to_string(&value).expect("a string serializes");
            let escaped = escaped[1..escaped.len() - 1].to_string();
            // as JSON writers that keep to ASCII write it (Python's json.dumps by default)
            let ascii: String = escaped
                .encode_utf16()
                .map(|unit| match unit {
                    0..=0x7f => char::from(unit as u8).to_string(),
                    _ => format!("\\u{unit:04x}"),
                })
                .collect();
            let encoded = attune_core::template::url_encoded(&Value::String(value.clone()));
            values.extend([value, escaped, ascii, encoded]);
        }
        values.retain(|v| !v.is_empty());
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        values.dedup();
        let windows = values
            .iter()
            .flat_map(|v| v.as_bytes().windows(PIECE))
            .map(|window| <[u8; PIECE]>::try_from(window).expect("a window of PIECE bytes"))
            .collect();
        let short_parts = values
            .iter()
            .flat_map(|v| (1..PIECE).flat_map(move |length| v.as_bytes().windows(length)))
            .map(short_key)
            .collect();
        Redactor { values, windows, short_parts }
    }

    /// The byte ranges of `text` to redact, in order and apart: every run that windows of a
    /// value cover, and every whole occurrence of a shorter one.
    fn covered(&self, text: &[u8]) -> Vec<(usize, usize)> {
        let mut marks: Vec<(usize, usize)> = Vec::new();
        let mut mark = |start: usize, end: usize| match marks.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => marks.push((start, end)),
        };
        let short: Vec<&[u8]> = self.values.iter().map(String::as_bytes).filter(|v| v.len() < PIECE).collect();
        for start in 0..text.len() {
            if let Some(window) = text.get(start..start + PIECE)
                && self.windows.contains(window)
            {
                mark(start, start + PIECE);
            }
            // (the longest first: one inside another is covered by it)
            if let Some(value) = short.iter().find(|v| text[start..].starts_with(v)) {
                mark(start, start + value.len());
            }
        }
        marks
    }

    /// How many of the bytes just before `end` are a part of a value (in any of its forms), or
    /// (past `PIECE` bytes) are covered by its windows: the longest such tail, found in time
    /// linear in its length.
    fn part_before(&self, bytes: &[u8], end: usize) -> usize {
        let window = |start: usize| {
            <&[u8; PIECE]>::try_from(&bytes[start..start + PIECE]).is_ok_and(|w| self.windows.contains(w))
        };
        if end >= PIECE && window(end - PIECE) {
            let mut start = end - PIECE;
            while start > 0 && window(start - 1) {
                start -= 1;
            }
            return end - start;
        }
        (1..PIECE.min(end + 1))
            .rev()
            .find(|&k| self.short_parts.contains(&short_key(&bytes[end - k..end])))
            .unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The largest cut at or before `end` in `bytes` that splits no part of a value: the bytes
    /// just before it that are a part of one (in any form, of any length) are held back, so
    /// that each piece of a value goes whole into one message and is redacted there (sent
    /// apart, neither half might be, and the follower would join them). No cut is needed at the
    /// end of `bytes` unless `more_may_come`. 0 when every cut would split one (the caller then
    /// sends what it must).
    pub fn cut_before(&self, bytes: &[u8], end: usize, more_may_come: bool) -> usize {
        let end = end.min(bytes.len());
        if end == bytes.len() && !more_may_come {
            return end;
        }
        end - self.part_before(bytes, end)
    }

    pub fn text(&self, text: &str) -> String {
        if self.values.is_empty() {
            return text.to_string();
        }
        let mut redacted = String::with_capacity(text.len());
        let mut from = 0;
        for (mut start, mut end) in self.covered(text.as_bytes()) {
            // (whole characters: a piece may begin or end inside one)
            while !text.is_char_boundary(start) {
                start -= 1;
            }
            while !text.is_char_boundary(end) {
                end += 1;
            }
            if start < from {
                start = from;
            }
            if end <= start {
                continue;
            }
            redacted.push_str(&text[from..start]);
            redacted.push_str(REDACTED);
            from = end;
        }
        redacted.push_str(&text[from..]);
        redacted
    }

    /// Every string of `value` (keys too), redacted.
    pub fn json(&self, value: &mut Value) {
        match value {
            Value::String(s) => *s = self.text(s),
            Value::Array(items) => items.iter_mut().for_each(|item| self.json(item)),
            Value::Object(object) => {
                let entries = std::mem::take(object);
                for (key, mut item) in entries {
                    self.json(&mut item);
                    object.insert(self.text(&key), item);
                }
            }
            _ => {}
        }
    }
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_sealed_value_opens_only_with_its_key_and_its_context() {
        let sealer = Sealer::from_key(&[7u8; 32]);
        let sealed = sealer.seal("db_password", "hunter2");
        assert!(!to_hex(&sealed).contains(&to_hex(b"hunter2")));
        assert_eq!(sealer.open("db_password", &sealed).as_deref(), Ok("hunter2"));
        assert_eq!(sealer.open("other_name", &sealed), Err(Unopenable), "the name is bound in");
        assert_eq!(Sealer::from_key(&[8u8; 32]).open("db_password", &sealed), Err(Unopenable));
        let mut altered = sealed.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert_eq!(sealer.open("db_password", &altered), Err(Unopenable));
        assert_ne!(sealer.seal("db_password", "hunter2"), sealed, "a fresh nonce each time");
    }

    #[test]
    fn sealed_parameters_are_shown_redacted_and_references_as_they_are() {
        let sealer = Sealer::from_key(&[1u8; 32]);
        let mut parameters =
            json!({"token": sealer.seal_parameter("p.a", "token", "s3cr3t"), "api": {"$secret": "shop"}, "n": 1});
        shown(&mut parameters);
        assert_eq!(parameters, json!({"token": REDACTED, "api": {"$secret": "shop"}, "n": 1}));
    }

    #[test]
    fn a_sealed_parameter_opens_only_as_the_parameter_of_the_action_it_was_sealed_for() {
        let sealer = Sealer::from_key(&[3u8; 32]);
        let sealed = sealer.seal_parameter("shop.order", "token", "s3cr3t");
        let bytes = from_hex(sealed[SEALED_KEY].as_str().unwrap()).unwrap();
        assert_eq!(sealer.open(&parameter_context("shop.order", "token"), &bytes).as_deref(), Ok("s3cr3t"));
        assert!(sealer.open(&parameter_context("shop.order", "note"), &bytes).is_err(), "another parameter");
        assert!(sealer.open(&parameter_context("core.echo", "token"), &bytes).is_err(), "another action");
    }

    #[test]
    fn the_redactor_finds_a_value_escaped_as_json_and_encoded_in_a_url() {
        let redactor = Redactor::new(vec!["a\"b c/é".into()]);
        assert_eq!(redactor.text(r#"{"v": "a\"b c/é"}"#), format!(r#"{{"v": "{REDACTED}"}}"#));
        assert_eq!(redactor.text(r#"print: "a\"b c/\u00e9""#), format!(r#"print: "{REDACTED}""#), "ASCII-only JSON");
        let encoded = attune_core::template::url_encoded(&Value::String("a\"b c/é".into()));
        assert_eq!(redactor.text(&format!("GET http://h/{encoded}")), format!("GET http://h/{REDACTED}"));
    }

    /// Every piece of eight bytes or more of `secret` that `text` holds.
    fn pieces_in(text: &str, secret: &str) -> Vec<String> {
        (0..=secret.len() - PIECE)
            .map(|at| &secret[at..at + PIECE])
            .filter(|piece| text.contains(piece))
            .map(String::from)
            .collect()
    }

    #[test]
    fn no_piece_of_a_value_survives_a_cut_or_a_part_printed() {
        let secret = "planted-CUT-secret-0123456789abc";
        let redactor = Redactor::new(vec![secret.into(), "short".into()]);
        let output = format!("before {secret} after");
        // the output cut anywhere: what is kept of it, redacted, holds no piece
        for at in 0..output.len() {
            for kept in [&output[at..], &output[..at]] {
                let shown = redactor.text(kept);
                assert!(pieces_in(&shown, secret).is_empty(), "{kept:?} was shown as {shown:?}");
            }
        }
        // a part of it printed alone, inside other text, or in its JSON form
        for (start, end) in [(0, 8), (4, 24), (10, 32), (3, 12)] {
            let part = &secret[start..end];
            let shown = redactor.text(&format!("x {part} y"));
            assert_eq!(shown, format!("x {REDACTED} y"), "{part:?}");
        }
        assert_eq!(redactor.text("0123456"), "0123456", "a part under eight bytes is left");
        assert_eq!(redactor.text("a short one, shorter"), format!("a {REDACTED} one, {REDACTED}er"));
        assert_eq!(redactor.text("é-CUT-secret-é"), format!("é{REDACTED}é"), "whole characters");
    }

    #[test]
    fn a_cut_splits_no_part_of_a_value_between_two_messages() {
        let secret = "planted-CUT-secret-0123456789abc";
        let redactor = Redactor::new(vec![secret.into()]);
        let stream = format!("{}{secret}{}{}\n", "x".repeat(13), &secret[9..20], "y".repeat(9));
        // sent in messages of at most `most` bytes, each cut where the redactor says, each
        // redacted alone: joined again, no piece of the value is shown
        for most in 3..40 {
            let bytes = stream.as_bytes();
            let (mut shown, mut from) = (String::new(), 0);
            while from < bytes.len() {
                let rest = &bytes[from..];
                let end = rest.len().min(most);
                let cut = match redactor.cut_before(rest, end, true) {
                    0 => end,
                    cut => cut,
                };
                shown.push_str(&redactor.text(std::str::from_utf8(&rest[..cut]).unwrap()));
                from += cut;
            }
            let pieces = pieces_in(&shown, secret);
            assert!(pieces.is_empty() || most < PIECE, "messages of {most}: {shown:?} shows {pieces:?}");
        }
    }

    #[test]
    fn a_long_value_is_not_split_between_messages_either() {
        // a key of some kilobytes (a PEM's size), printed whole and in part among other output
        let secret: String = (0..4096u32).map(|i| char::from(b'A' + ((i * 7 + i / 26) % 26) as u8)).collect();
        let redactor = Redactor::new(vec![secret.clone()]);
        let stream = format!("{}{secret}\n{}{}\n", "x".repeat(10_000), &secret[100..3000], "y".repeat(20_000));
        let bytes = stream.as_bytes();
        let (mut shown, mut from) = (String::new(), 0);
        while from < bytes.len() {
            let rest = &bytes[from..];
            let end = rest.len().min(16 * 1024);
            let cut = match redactor.cut_before(rest, end, from + end < bytes.len()) {
                0 => end,
                cut => cut,
            };
            shown.push_str(&redactor.text(std::str::from_utf8(&rest[..cut]).unwrap()));
            from += cut;
        }
        assert!(pieces_in(&shown, &secret).is_empty());
        assert_eq!(shown.matches(REDACTED).count(), 2, "one redaction for each printing");
    }

    #[test]
    fn the_redactor_replaces_every_value_in_text_and_json() {
        let redactor = Redactor::new(vec!["abc".into(), "abcdef".into(), String::new()]);
        assert_eq!(redactor.text("x abcdef y abc"), format!("x {REDACTED} y {REDACTED}"));
        let mut value = json!({"abc": ["abcdef", 1, {"k": "zabcz"}]});
        redactor.json(&mut value);
        assert_eq!(value, json!({REDACTED: [REDACTED, 1, {"k": format!("z{REDACTED}z")}]}));
    }

    /// `ATTUNE_SECRETS_KEY_FILE` alone, set to a path.
    struct KeyFile(Option<String>);

    impl Source for KeyFile {
        fn var(&self, name: &str) -> Option<String> {
            self.0.clone().filter(|_| name == KEY_FILE)
        }
    }

    #[test]
    fn a_rotated_key_seals_and_the_previous_one_still_opens_until_resealed() {
        let (old, new) = ([1u8; 32], [2u8; 32]);
        let before = Sealer::from_key(&old);
        let stored = before.seal("shop", "v4lue");
        let parameter = before.seal_parameter("core.echo", "token", "t0ken");
        let rotating = Sealer::from_key(&new).with_previous(&[&old]);
        assert_eq!(rotating.open("shop", &stored).unwrap(), "v4lue", "the previous key opens");
        assert!(!rotating.sealed_with_current("shop", &stored));
        let resealed = rotating.reseal_parameter("core.echo", "token", &parameter).unwrap().expect("resealed");
        assert_eq!(rotating.reseal_parameter("core.echo", "token", &resealed).unwrap(), None, "once");
        let after = Sealer::from_key(&new);
        assert!(after.open("shop", &stored).is_err(), "without the previous key");
        let bytes = from_hex(resealed[SEALED_KEY].as_str().unwrap()).unwrap();
        assert_eq!(after.open(&parameter_context("core.echo", "token"), &bytes).unwrap(), "t0ken");
        assert_eq!(Sealer::from_key(&[3u8; 32]).reseal_parameter("core.echo", "token", &parameter), Err(Unopenable));
    }

    #[test]
    fn the_key_file_is_64_hex_digits_and_errors_name_the_setting() {
        let dir = std::env::temp_dir().join(format!("attune-key-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let (good, bad) = (dir.join("good"), dir.join("bad"));
        std::fs::write(&good, format!("{}\n", "ab".repeat(32))).unwrap();
        std::fs::write(&bad, "abcd").unwrap();
        let path = |p: &Path| KeyFile(Some(p.display().to_string()));
        assert!(Sealer::from_source(&KeyFile(None)).unwrap().is_none());
        assert!(Sealer::from_source(&path(&good)).unwrap().is_some());
        for unusable in [bad, dir.join("missing")] {
            let error = Sealer::from_source(&path(&unusable)).unwrap_err();
            assert_eq!((error.name.as_str(), error.value.as_str()), (KEY_FILE, unusable.to_str().unwrap()));
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
