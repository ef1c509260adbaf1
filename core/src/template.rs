//! `{{ name }}` templates of an HTTP action's `url`, `headers` and `body`: each placeholder is
//! replaced by the value of the parameter it names, encoded for where it stands (URL-encoded in
//! the URL, JSON-encoded in a JSON body, as text in a header). A placeholder is a parameter's
//! name and nothing else: no expressions, no filters, no lookups. The pack loader refuses a
//! placeholder naming no declared parameter, so rendering only meets names it knows.

use serde_json::Value;

/// One piece of a template: literal text, or the parameter a placeholder names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<'a> {
    Text(&'a str),
    Param(&'a str),
}

/// Splits `text` into literal text and placeholders. `Err` says what is wrong with a placeholder
/// (an unclosed `{{`, an empty or non-identifier name).
pub fn parse(text: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        if open > 0 {
            pieces.push(Piece::Text(&rest[..open]));
        }
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| format!("'{{{{' at byte {} is never closed", text.len() - rest.len() + open))?;
        let name = after[..close].trim();
        if !crate::pack::is_identifier(name) {
            return Err(format!(
                "'{{{{{}}}}}' does not name a parameter (lowercase letters, digits, '_' or '-')",
                &after[..close]
            ));
        }
        pieces.push(Piece::Param(name));
        rest = &after[close + 2..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest));
    }
    Ok(pieces)
}

/// The parameter names `text` refers to, in order (with repeats).
pub fn names(text: &str) -> Result<Vec<&str>, String> {
    Ok(parse(text)?
        .into_iter()
        .filter_map(|p| match p {
            Piece::Param(name) => Some(name),
            Piece::Text(_) => None,
        })
        .collect())
}

/// The text of a parameter value: a string as itself, null as nothing, anything else as JSON.
pub fn plain(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// `value`'s text percent-encoded for a URL: everything but the unreserved characters of
/// RFC 3986 (`A-Z a-z 0-9 - . _ ~`) is encoded, so a value cannot add a path segment, a query
/// parameter or a fragment.
pub fn url_encoded(value: &Value) -> String {
    let mut out = String::new();
    for byte in plain(value).bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `value` as JSON text (a string with its quotes).
pub fn json_encoded(value: &Value) -> String {
    value.to_string()
}

/// Renders `text` with each placeholder replaced by `encode` of its parameter's value (a missing
/// parameter is null).
pub fn render(text: &str, parameters: &Value, encode: impl Fn(&Value) -> String) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    for piece in parse(text)? {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Param(name) => out.push_str(&encode(parameters.get(name).unwrap_or(&Value::Null))),
        }
    }
    Ok(out)
}

/// Renders a structured (JSON) body: a string that is one placeholder and nothing else becomes
/// the parameter's value with its type (`"{{ count }}"` → `3`); placeholders inside longer
/// strings, and in object keys, are replaced by the value's text.
pub fn render_json(body: &Value, parameters: &Value) -> Result<Value, String> {
    Ok(match body {
        Value::String(text) => match parse(text)?.as_slice() {
            [Piece::Param(name)] => parameters.get(*name).cloned().unwrap_or(Value::Null),
            _ => Value::String(render(text, parameters, plain)?),
        },
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| render_json(v, parameters)).collect::<Result<_, _>>()?)
        }
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (key, value) in map {
                out.insert(render(key, parameters, plain)?, render_json(value, parameters)?);
            }
            Value::Object(out)
        }
        other => other.clone(),
    })
}

/// Every placeholder name in a structured body (keys and string values).
pub fn json_names(body: &Value) -> Result<Vec<String>, String> {
    let mut found = Vec::new();
    fn walk(value: &Value, found: &mut Vec<String>) -> Result<(), String> {
        match value {
            Value::String(text) => found.extend(names(text)?.into_iter().map(str::to_string)),
            Value::Array(items) => items.iter().try_for_each(|v| walk(v, found))?,
            Value::Object(map) => {
                for (key, value) in map {
                    found.extend(names(key)?.into_iter().map(str::to_string));
                    walk(value, found)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
    walk(body, &mut found)?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn placeholders_are_names_only() {
        assert_eq!(
            parse("a{{ x }}b{{y}}").unwrap(),
            vec![Piece::Text("a"), Piece::Param("x"), Piece::Text("b"), Piece::Param("y")]
        );
        assert!(parse("{{ x").unwrap_err().contains("never closed"));
        assert!(parse("{{ }}").is_err());
        assert!(parse("{{ x | upper }}").is_err());
        assert!(parse("{{ a.b }}").is_err());
        assert_eq!(parse("no placeholders").unwrap(), vec![Piece::Text("no placeholders")]);
    }

    #[test]
    fn a_value_cannot_change_the_shape_of_a_url() {
        let params = json!({"q": "a b&c=d/../#e", "n": 3});
        let url = render("http://h/search/{{ q }}?n={{n}}", &params, url_encoded).unwrap();
        assert_eq!(url, "http://h/search/a%20b%26c%3Dd%2F..%2F%23e?n=3");
        assert_eq!(url_encoded(&json!("é")), "%C3%A9");
    }

    #[test]
    fn a_json_body_keeps_types_and_escapes_text() {
        let params = json!({"name": "say \"hi\"\n", "count": 3, "tags": ["a"]});
        let body = json!({"who": "{{ name }}", "n": "{{count}}", "tags": "{{ tags }}", "msg": "hello {{ name }}!", "missing": "{{ other }}"});
        assert_eq!(
            render_json(&body, &params).unwrap(),
            json!({"who": "say \"hi\"\n", "n": 3, "tags": ["a"], "msg": "hello say \"hi\"\n!", "missing": null})
        );
        let text = render("{\"who\": {{ name }}}", &params, json_encoded).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), json!({"who": "say \"hi\"\n"}));
        let mut named = json_names(&body).unwrap();
        named.sort();
        named.dedup();
        assert_eq!(named, ["count", "name", "other", "tags"]);
    }
}
