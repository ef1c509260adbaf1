//! Declared action parameters and the validation of submitted ones against them.
//!
//! Parameters are checked before anything is queued: an unknown name, a missing required one or a
//! value of the wrong type is an error that names the parameter. Defaults are filled in, so the
//! stored execution shows exactly what the script received.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamType {
    String,
    Integer,
    Number,
    Boolean,
    Object,
    Array,
}

impl ParamType {
    fn name(self) -> &'static str {
        match self {
            ParamType::String => "string",
            ParamType::Integer => "integer",
            ParamType::Number => "number",
            ParamType::Boolean => "boolean",
            ParamType::Object => "object",
            ParamType::Array => "array",
        }
    }

    fn accepts(self, value: &Value) -> bool {
        match self {
            ParamType::String => value.is_string(),
            ParamType::Integer => value.is_i64() || value.is_u64(),
            ParamType::Number => value.is_number(),
            ParamType::Boolean => value.is_boolean(),
            ParamType::Object => value.is_object(),
            ParamType::Array => value.is_array(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamSpec {
    #[serde(rename = "type")]
    pub param_type: ParamType,
    #[serde(default)]
    pub required: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// When present, the value must be one of these.
    #[serde(default, rename = "enum", skip_serializing_if = "Option::is_none")]
    pub allowed: Option<Vec<Value>>,
    /// A secret (a string): sealed by the API at submission, shown `[redacted]`, opened by the
    /// worker only to run the action (`attune_common::secrets`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret: bool,
    /// For a string: a regular expression the whole value must match (`^(?:pattern)$`; matching
    /// takes time linear in the value, whatever the pattern).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// For a string: the fewest characters it may have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_length: Option<usize>,
    /// For a string: the most characters it may have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<usize>,
}

/// The most characters a parameter's `pattern` may have.
pub const MAX_PATTERN_CHARS: usize = 1024;

impl ParamSpec {
    /// The `pattern` compiled, anchored to the whole value.
    fn compiled_pattern(&self) -> Option<Result<regex_lite::Regex, regex_lite::Error>> {
        self.pattern
            .as_ref()
            .map(|pattern| regex_lite::RegexBuilder::new(&format!("^(?:{pattern})$")).size_limit(1 << 20).build())
    }

    /// What a string value is held to besides its type: its length and pattern. The reason
    /// names the rule, never the value.
    fn check_string(&self, value: &str) -> Result<(), String> {
        let chars = value.chars().count();
        if let Some(min) = self.min_length
            && chars < min
        {
            return Err(format!("must be at least {min} characters long (it has {chars})"));
        }
        if let Some(max) = self.max_length
            && chars > max
        {
            return Err(format!("must be at most {max} characters long (it has {chars})"));
        }
        match self.compiled_pattern() {
            Some(Ok(pattern)) if !pattern.is_match(value) => {
                Err(format!("does not match the pattern {:?}", self.pattern.as_deref().unwrap_or_default()))
            }
            Some(Err(e)) => Err(format!("its declared pattern does not compile: {e}")),
            _ => Ok(()),
        }
    }
}

/// The key of a reference to a stored secret, `{"$secret": "<name>"}`, which a string
/// parameter takes in place of its value.
pub const SECRET_KEY: &str = "$secret";
/// The key of a sealed secret parameter as the record keeps it, `{"$sealed": "<hex>"}`.
pub const SEALED_KEY: &str = "$sealed";

/// The secret `value` refers to, when it is a reference `{"$secret": "<name>"}`.
pub fn secret_reference(value: &Value) -> Option<&str> {
    let object = value.as_object().filter(|o| o.len() == 1)?;
    object.get(SECRET_KEY)?.as_str()
}

pub type ParamSpecs = BTreeMap<String, ParamSpec>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("parameter '{parameter}': {reason}")]
pub struct ParamError {
    pub parameter: String,
    pub reason: String,
}

impl ParamError {
    fn new(parameter: &str, reason: impl Into<String>) -> Self {
        ParamError { parameter: parameter.to_string(), reason: reason.into() }
    }
}

/// Checks a spec on its own (used at pack load): a default must fit its type and enum; a secret
/// parameter is a string, and its default may only be a reference to a stored secret (a value
/// written in a pack file is no secret).
pub fn check_spec(name: &str, spec: &ParamSpec) -> Result<(), ParamError> {
    if spec.secret && spec.param_type != ParamType::String {
        return Err(ParamError::new(name, "a secret parameter must be of type string"));
    }
    let string_rules = spec.pattern.is_some() || spec.min_length.is_some() || spec.max_length.is_some();
    if string_rules && spec.param_type != ParamType::String {
        return Err(ParamError::new(name, "'pattern', 'min_length' and 'max_length' apply to a string parameter"));
    }
    if let (Some(min), Some(max)) = (spec.min_length, spec.max_length)
        && min > max
    {
        return Err(ParamError::new(name, format!("'min_length' ({min}) is more than 'max_length' ({max})")));
    }
    if let Some(pattern) = &spec.pattern {
        if pattern.chars().count() > MAX_PATTERN_CHARS {
            return Err(ParamError::new(name, format!("'pattern' is longer than {MAX_PATTERN_CHARS} characters")));
        }
        if let Some(Err(e)) = spec.compiled_pattern() {
            return Err(ParamError::new(name, format!("'pattern' is not a regular expression: {e}")));
        }
    }
    if let Some(default) = &spec.default {
        if spec.secret && secret_reference(default).is_none() {
            return Err(ParamError::new(
                name,
                "a secret parameter's default must be a reference to a stored secret ({\"$secret\": \"<name>\"})",
            ));
        }
        check_value(name, spec, default)?;
    }
    Ok(())
}

fn check_value(name: &str, spec: &ParamSpec, value: &Value) -> Result<(), ParamError> {
    if value.as_object().is_some_and(|o| o.contains_key(SEALED_KEY)) {
        // only the API seals a value, for a parameter declared secret
        return Err(ParamError::new(name, format!("'{SEALED_KEY}' is reserved for values the API seals")));
    }
    if let Some(secret) = secret_reference(value) {
        // a reference stands for a string, checked when the worker opens it (`check_opened`)
        if spec.param_type != ParamType::String {
            return Err(ParamError::new(name, "only a string parameter takes a reference to a secret"));
        }
        if secret.is_empty() || secret.len() > 128 {
            return Err(ParamError::new(name, "a secret's name is 1 to 128 characters"));
        }
        return Ok(());
    }
    if !spec.param_type.accepts(value) {
        return Err(ParamError::new(name, format!("expected {}, got {}", spec.param_type.name(), json_type(value))));
    }
    if let Some(allowed) = &spec.allowed
        && !allowed.contains(value)
    {
        let options: Vec<String> = allowed.iter().map(Value::to_string).collect();
        return Err(ParamError::new(name, format!("must be one of {}", options.join(", "))));
    }
    if let Some(text) = value.as_str() {
        spec.check_string(text).map_err(|reason| ParamError::new(name, reason))?;
    }
    Ok(())
}

/// Checks the value a secret parameter stood for once the worker has opened it (a reference to a
/// stored secret, or a value the API sealed): what a value given plainly is held to, its `enum`,
/// length and pattern. The reason never shows the value.
pub fn check_opened(name: &str, spec: &ParamSpec, value: &str) -> Result<(), ParamError> {
    if let Some(allowed) = &spec.allowed
        && !allowed.iter().any(|option| option.as_str() == Some(value))
    {
        let options: Vec<String> = allowed.iter().map(Value::to_string).collect();
        return Err(ParamError::new(
            name,
            format!("the secret's value is not one of the values the parameter allows ({})", options.join(", ")),
        ));
    }
    spec.check_string(value).map_err(|reason| ParamError::new(name, format!("the secret's value {reason}")))
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Validates submitted parameters against the declared ones and returns them with defaults
/// filled in. The first problem found, in parameter-name order, is reported.
pub fn validate(specs: &ParamSpecs, given: &Map<String, Value>) -> Result<Map<String, Value>, ParamError> {
    if let Some(unknown) = given.keys().find(|name| !specs.contains_key(*name)) {
        let known: Vec<&str> = specs.keys().map(String::as_str).collect();
        let reason = if known.is_empty() {
            "unknown parameter (this action takes none)".to_string()
        } else {
            format!("unknown parameter (expected one of: {})", known.join(", "))
        };
        return Err(ParamError::new(unknown, reason));
    }
    let mut resolved = Map::new();
    for (name, spec) in specs {
        match given.get(name) {
            Some(Value::Null) | None => {
                if let Some(default) = &spec.default {
                    resolved.insert(name.clone(), default.clone());
                } else if spec.required {
                    return Err(ParamError::new(name, "is required"));
                }
            }
            Some(value) => {
                check_value(name, spec, value)?;
                resolved.insert(name.clone(), value.clone());
            }
        }
    }
    Ok(resolved)
}

/// The first key or string in `value` holding a NUL character (which PostgreSQL cannot store),
/// as its path below `path`: `parameters.message`, `config.tags[1]`. The API refuses such input
/// and the pack loader such files, both by this.
pub fn nul_path(value: &Value, path: &str) -> Option<String> {
    let join = |key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    match value {
        Value::String(text) => text.contains('\0').then(|| path.to_string()),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, item)| nul_path(item, &format!("{path}[{i}]"))),
        Value::Object(map) => map
            .iter()
            .find_map(|(key, item)| if key.contains('\0') { Some(join(key)) } else { nul_path(item, &join(key)) }),
        _ => None,
    }
}

/// How large submitted parameters may be: they reach an action as environment variables (one
/// per parameter, and all of them as `ATTUNE_PARAMETERS`), and the operating system refuses to
/// start a program with a variable over 128 KiB or an environment over about 2 MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeLimits {
    /// All parameters, as JSON.
    pub total_bytes: usize,
    /// One value: a string's own bytes, any other value's JSON.
    pub value_bytes: usize,
}

/// A size limit a submission exceeds, naming the parameter (the largest one, for the total).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge {
    pub parameter: String,
    pub bytes: usize,
    pub limit: usize,
    /// Whether the total (rather than the parameter's own value) is over its limit.
    pub total: bool,
}

/// The size of one value as an action receives it.
fn value_bytes(value: &Value) -> usize {
    match value {
        Value::String(text) => text.len(),
        other => other.to_string().len(),
    }
}

/// Checks parameters (as resolved, defaults included) against `limits`.
pub fn check_size(parameters: &Map<String, Value>, limits: SizeLimits) -> Result<(), TooLarge> {
    let mut largest: Option<(&String, usize)> = None;
    for (name, value) in parameters {
        let bytes = value_bytes(value);
        if bytes > limits.value_bytes {
            return Err(TooLarge { parameter: name.clone(), bytes, limit: limits.value_bytes, total: false });
        }
        if largest.is_none_or(|(_, most)| bytes > most) {
            largest = Some((name, bytes));
        }
    }
    let total = Value::Object(parameters.clone()).to_string().len();
    match largest {
        Some((name, _)) if total > limits.total_bytes => {
            Err(TooLarge { parameter: name.clone(), bytes: total, limit: limits.total_bytes, total: true })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn secret_parameters_are_strings_whose_default_can_only_be_a_reference() {
        let spec = |yaml: &str| serde_yaml_ng::from_str::<ParamSpec>(yaml).unwrap();
        assert!(check_spec("t", &spec("{type: string, secret: true}")).is_ok());
        assert!(check_spec("t", &spec("{type: string, secret: true, default: {$secret: shop}}")).is_ok());
        let literal = check_spec("t", &spec("{type: string, secret: true, default: hunter2}")).unwrap_err();
        assert!(literal.reason.contains("reference"), "{literal}");
        assert!(check_spec("t", &spec("{type: integer, secret: true}")).is_err());
        // a reference stands for a string, for any string parameter, and for nothing else
        let string = spec("{type: string}");
        assert!(check_value("s", &string, &serde_json::json!({"$secret": "shop"})).is_ok());
        assert!(check_value("s", &spec("{type: integer}"), &serde_json::json!({"$secret": "shop"})).is_err());
        assert!(check_value("s", &string, &serde_json::json!({"$secret": "shop", "x": 1})).is_err());
        // a sealed value is the API's to make, for any parameter
        let object = spec("{type: object}");
        assert!(check_value("o", &object, &serde_json::json!({"$sealed": "00"})).is_err());
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn a_string_is_held_to_its_length_and_whole_pattern_and_an_opened_secret_alike() {
        let spec = |yaml: &str| serde_yaml_ng::from_str::<ParamSpec>(yaml).unwrap();
        let host = spec("{type: string, pattern: '[a-z0-9-]+', min_length: 3, max_length: 10}");
        assert!(check_spec("host", &host).is_ok());
        assert!(check_value("host", &host, &json!("web-01")).is_ok());
        let error = check_value("host", &host, &json!("web-01; rm -rf /")).unwrap_err();
        assert!(error.reason.contains("at most 10"), "{error}");
        let error = check_value("host", &host, &json!("WEB")).unwrap_err();
        assert!(error.reason.contains("pattern"), "{error}");
        assert!(check_value("host", &host, &json!("ab")).unwrap_err().reason.contains("at least 3"));
        // the whole value: a pattern matching a part is not enough
        assert!(check_value("host", &spec("{type: string, pattern: 'web'}"), &json!("a web b")).is_err());
        // an opened secret meets the same rules; the reason never shows the value
        let opened = check_opened("host", &host, "Hunter2-Secret").unwrap_err();
        assert!(opened.reason.starts_with("the secret's value") && !opened.to_string().contains("Hunter2"), "{opened}");
        assert!(check_opened("host", &host, "db-7").is_ok());
        // a reference is checked when it is opened, not as the reference it is
        assert!(check_value("host", &host, &json!({"$secret": "x"})).is_ok());
        // the rules themselves
        assert!(check_spec("n", &spec("{type: integer, pattern: '[0-9]+'}")).is_err());
        assert!(check_spec("s", &spec("{type: string, pattern: '(unclosed'}")).unwrap_err().reason.contains("pattern"));
        assert!(check_spec("s", &spec("{type: string, min_length: 5, max_length: 2}")).is_err());
        assert!(
            check_spec("s", &spec("{type: string, default: UPPER, pattern: '[a-z]+'}")).is_err(),
            "a default meets them"
        );
    }

    fn specs() -> ParamSpecs {
        serde_json::from_value(json!({
            "url": {"type": "string", "required": true},
            "count": {"type": "integer", "default": 3},
            "ratio": {"type": "number"},
            "verbose": {"type": "boolean"},
            "mode": {"type": "string", "enum": ["fast", "slow"]},
        }))
        .unwrap()
    }

    fn given(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn fills_defaults_and_keeps_given_values() {
        let out = validate(&specs(), &given(json!({"url": "http://x", "ratio": 1}))).unwrap();
        assert_eq!(Value::Object(out), json!({"url": "http://x", "count": 3, "ratio": 1}));
    }

    #[test]
    fn errors_name_the_parameter() {
        let cases = [
            (json!({}), "url", "is required"),
            (json!({"url": null}), "url", "is required"),
            (json!({"url": 5}), "url", "expected string, got integer"),
            (json!({"url": "u", "count": 1.5}), "count", "expected integer, got number"),
            (json!({"url": "u", "ratio": "high"}), "ratio", "expected number, got string"),
            (json!({"url": "u", "verbose": "yes"}), "verbose", "expected boolean, got string"),
            (json!({"url": "u", "mode": "medium"}), "mode", "must be one of \"fast\", \"slow\""),
            (json!({"url": "u", "colour": "red"}), "colour", "unknown parameter"),
        ];
        for (input, parameter, reason) in cases {
            let err = validate(&specs(), &given(input.clone())).unwrap_err();
            assert_eq!(err.parameter, parameter, "{input}");
            assert!(err.reason.starts_with(reason), "{input}: {}", err.reason);
        }
    }

    #[test]
    fn spec_defaults_are_checked() {
        let spec: ParamSpec = serde_json::from_value(json!({"type": "integer", "default": "x"})).unwrap();
        assert_eq!(check_spec("n", &spec).unwrap_err().parameter, "n");
    }

    #[test]
    fn sizes_are_checked_per_value_and_in_total_naming_the_parameter() {
        let limits = SizeLimits { total_bytes: 100, value_bytes: 40 };
        let object = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(check_size(&object(json!({"a": "x".repeat(40), "b": 7})), limits), Ok(()));
        let too_long = check_size(&object(json!({"a": "x".repeat(41)})), limits).unwrap_err();
        assert_eq!((too_long.parameter.as_str(), too_long.bytes, too_long.total), ("a", 41, false));
        // a non-string counts as its JSON text
        let list = check_size(&object(json!({"list": vec![1234567; 6]})), limits).unwrap_err();
        assert_eq!((list.parameter.as_str(), list.bytes), ("list", 49));
        // each under 40, together over 100: the largest is named
        let total = check_size(&object(json!({"a": "x".repeat(30), "b": "y".repeat(35), "c": "z".repeat(30)})), limits)
            .unwrap_err();
        assert_eq!((total.parameter.as_str(), total.total, total.limit), ("b", true, 100));
        assert_eq!(check_size(&Map::new(), limits), Ok(()));
    }
}
