//! A workflow's expressions: `{{ path }}` references in step parameters, `with-items` and the
//! result, and the conditions of `when`.
//!
//! A path is a root and keys or array indices, joined by `.`: `input.hosts`,
//! `steps.check.result.unhealthy.0`, `item.name`, `index`, `failure.error`. A string that is one
//! reference and nothing else takes the referenced value as it is (a list stays a list); a
//! reference inside other text is replaced by its text (a string as itself, anything else as
//! JSON). A path that leads nowhere is an error naming the path and where it stopped, never a
//! silent null.
//!
//! A condition is a comparison, or several joined by `and`, `or`, `not` and parentheses:
//! `{{ steps.check.result.healthy }} == false`, `{{ steps.check.status }} in ['failed', 'skipped']`,
//! `{{ steps.check.result.unhealthy }}` alone (true unless false, null, 0, "", [] or {}).
//! Operands are references or literals (JSON, or a string in single quotes); the operators are
//! `==`, `!=`, `<`, `<=`, `>`, `>=` (numbers, or strings), `in` and `contains` (an element of an
//! array, a key of an object, a substring of a string).

use serde_json::{Map, Value};

/// The roots a path may start from.
pub const ROOTS: [&str; 5] = ["input", "steps", "item", "index", "failure"];

/// Where the language is spoken: the roots its paths may start from, and the one root (if any)
/// whose values may hold a stored secret's reference to pass on. A workflow's is [`WORKFLOW`]; a
/// rule's (`crate::rules`) has the event's roots and trusts none of them (a sender chooses what
/// an event holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dialect {
    pub roots: &'static [&'static str],
    pub trusted: Option<&'static str>,
}

/// A workflow's: [`ROOTS`]; the run's input may pass a stored secret on.
pub const WORKFLOW: Dialect = Dialect { roots: &ROOTS, trusted: Some("input") };

/// A parsed path: its segments, the root first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path(pub Vec<String>);

impl Path {
    pub fn parse(text: &str) -> Result<Path, String> {
        Path::parse_in(text, &WORKFLOW)
    }

    /// A path of `dialect`.
    pub fn parse_in(text: &str, dialect: &Dialect) -> Result<Path, String> {
        let roots = dialect.roots;
        let text = text.trim();
        let segments: Vec<String> = text.split('.').map(str::to_string).collect();
        if segments.iter().any(|s| s.is_empty() || s.contains(char::is_whitespace) || s.contains(['{', '}'])) {
            return Err(format!("'{text}' is not a path (keys or indices joined by '.', e.g. steps.check.result)"));
        }
        if !roots.contains(&segments[0].as_str()) {
            return Err(format!("'{text}' starts from no known root (expected one of: {})", roots.join(", ")));
        }
        Ok(Path(segments))
    }

    pub fn root(&self) -> &str {
        &self.0[0]
    }

    /// The segment after the root (the input's or step's name).
    pub fn name(&self) -> Option<&str> {
        self.0.get(1).map(String::as_str)
    }

    pub fn text(&self) -> String {
        self.0.join(".")
    }

    /// The value the path leads to in `scope` (an object keyed by root).
    pub fn lookup<'a>(&self, scope: &'a Value) -> Result<&'a Value, String> {
        let mut at = scope;
        for (n, segment) in self.0.iter().enumerate() {
            let next = match at {
                Value::Object(map) => map.get(segment),
                Value::Array(list) => segment.parse::<usize>().ok().and_then(|i| list.get(i)),
                _ => None,
            };
            at = next.ok_or_else(|| {
                let reached = self.0[..n].join(".");
                match at {
                    _ if n == 0 => format!("'{}' is not available here", segment),
                    Value::Object(_) => format!("{reached} has no '{segment}'"),
                    Value::Array(list) => format!("{reached} has {} items, no item '{segment}'", list.len()),
                    other => format!("{reached} is {}, which has no '{segment}'", kind(other)),
                }
            })?;
        }
        Ok(at)
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A piece of a string template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece<'a> {
    Text(&'a str),
    Ref(Path),
}

fn pieces<'a>(text: &'a str, dialect: &Dialect) -> Result<Vec<Piece<'a>>, String> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        if open > 0 {
            pieces.push(Piece::Text(&rest[..open]));
        }
        let after = &rest[open + 2..];
        let close = after.find("}}").ok_or_else(|| format!("'{{{{' in '{text}' is never closed"))?;
        pieces.push(Piece::Ref(Path::parse_in(&after[..close], dialect)?));
        rest = &after[close + 2..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest));
    }
    Ok(pieces)
}

/// Every path a template value refers to (strings anywhere inside it, keys excepted).
pub fn paths(template: &Value) -> Result<Vec<Path>, String> {
    paths_in(template, &WORKFLOW)
}

/// Every path a template value of `dialect` refers to.
pub fn paths_in(template: &Value, dialect: &Dialect) -> Result<Vec<Path>, String> {
    let mut found = Vec::new();
    collect(template, dialect, &mut found)?;
    Ok(found)
}

fn collect(template: &Value, dialect: &Dialect, found: &mut Vec<Path>) -> Result<(), String> {
    match template {
        Value::String(text) => {
            for piece in pieces(text, dialect)? {
                if let Piece::Ref(path) = piece {
                    found.push(path);
                }
            }
        }
        Value::Array(items) => items.iter().try_for_each(|item| collect(item, dialect, found))?,
        Value::Object(map) => map.values().try_for_each(|value| collect(value, dialect, found))?,
        _ => {}
    }
    Ok(())
}

/// The text of a value inside a string: a string as itself, null as nothing, anything else as JSON.
fn plain(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// `template` with every reference replaced from `scope`. A stored secret's reference
/// (`{"$secret": …}`) is passed on whole; inside other text it is refused, as its text would
/// be the reference and not the secret.
pub fn render(template: &Value, scope: &Value) -> Result<Value, String> {
    render_in(template, scope, &WORKFLOW)
}

/// `render` in `dialect`: a stored secret's reference is passed on only from its trusted root.
pub fn render_in(template: &Value, scope: &Value, dialect: &Dialect) -> Result<Value, String> {
    match template {
        Value::String(text) => {
            let pieces = pieces(text, dialect)?;
            if let [Piece::Ref(path)] = pieces.as_slice() {
                let value = path.lookup(scope)?;
                // what a step printed (or a sender sent) must not choose which secret an action
                // is given
                if dialect.trusted != Some(path.root()) && holds_secret(value) {
                    return Err(match dialect.trusted {
                        Some(root) => format!(
                            "{} holds a stored secret's reference: only the run's {root} passes one to a step",
                            path.text()
                        ),
                        None => format!(
                            "{} holds a stored secret's reference: only the definition itself names a secret",
                            path.text()
                        ),
                    });
                }
                return Ok(value.clone());
            }
            let mut out = String::new();
            for piece in pieces {
                match piece {
                    Piece::Text(text) => out.push_str(text),
                    Piece::Ref(path) => {
                        let value = path.lookup(scope)?;
                        if holds_secret(value) {
                            return Err(format!(
                                "{} is a stored secret: it can be passed only as a whole value (\"{{{{ {} }}}}\")",
                                path.text(),
                                path.text()
                            ));
                        }
                        out.push_str(&plain(value));
                    }
                }
            }
            Ok(Value::String(out))
        }
        Value::Array(items) => {
            items.iter().map(|item| render_in(item, scope, dialect)).collect::<Result<_, _>>().map(Value::Array)
        }
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, value) in map {
                out.insert(key.clone(), render_in(value, scope, dialect)?);
            }
            Ok(Value::Object(out))
        }
        other => Ok(other.clone()),
    }
}

fn holds_secret(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.contains_key(crate::params::SECRET_KEY) || map.values().any(holds_secret),
        Value::Array(items) => items.iter().any(holds_secret),
        _ => false,
    }
}

/// Whether a value counts as true where a condition is one operand alone.
pub fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(items) => !items.is_empty(),
        Value::Object(map) => !map.is_empty(),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ref(Path),
    Literal(Value),
    Op(&'static str),
    And,
    Or,
    Not,
    Open,
    Close,
}

const OPERATORS: [&str; 6] = ["==", "!=", "<=", ">=", "<", ">"];

fn tokens(text: &str, dialect: &Dialect) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        let c = bytes[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if rest.starts_with("{{") {
            let close = rest.find("}}").ok_or_else(|| format!("'{{{{' at byte {i} is never closed"))?;
            out.push(Token::Ref(Path::parse_in(&rest[2..close], dialect)?));
            i += close + 2;
        } else if let Some(op) = OPERATORS.iter().find(|op| rest.starts_with(**op)) {
            out.push(Token::Op(op));
            i += op.len();
        } else if c == b'(' {
            out.push(Token::Open);
            i += 1;
        } else if c == b')' {
            out.push(Token::Close);
            i += 1;
        } else if c == b'\'' {
            let end = rest[1..].find('\'').ok_or_else(|| format!("a quote at byte {i} is never closed"))?;
            out.push(Token::Literal(Value::String(rest[1..1 + end].to_string())));
            i += end + 2;
        } else if c == b'"' || c == b'[' || c == b'{' {
            let end = json_end(rest).ok_or_else(|| format!("the value at byte {i} is never closed"))?;
            let value = json_literal(&rest[..end])?;
            out.push(Token::Literal(value));
            i += end;
        } else {
            let end = rest.find(|ch: char| ch.is_ascii_whitespace() || "()=!<>".contains(ch)).unwrap_or(rest.len());
            let word = &rest[..end];
            out.push(match word {
                "and" => Token::And,
                "or" => Token::Or,
                "not" => Token::Not,
                "in" => Token::Op("in"),
                "contains" => Token::Op("contains"),
                _ => Token::Literal(serde_json::from_str(word).map_err(|_| {
                    format!("'{word}' is neither a value nor an operator (a string is quoted: '{word}')")
                })?),
            });
            i += end.max(1);
        }
    }
    Ok(out)
}

/// A JSON value written in a condition: double-quoted strings as JSON has them, single quotes
/// inside lists and objects taken for double ones.
fn json_literal(text: &str) -> Result<Value, String> {
    serde_json::from_str(text)
        .or_else(|_| serde_json::from_str(&text.replace('\'', "\"")))
        .map_err(|e| format!("'{text}' is not a value: {e}"))
}

/// Where the JSON string, list or object at the start of `text` ends.
fn json_end(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                    if depth == 0 {
                        return Some(i + 1);
                    }
                }
            }
            None => match c {
                '"' | '\'' => quote = Some(c),
                '[' | '{' => depth += 1,
                ']' | '}' => {
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            },
        }
    }
    None
}

/// A parsed condition.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    Value(Operand),
    Compare(Operand, &'static str, Operand),
    Not(Box<Condition>),
    And(Box<Condition>, Box<Condition>),
    Or(Box<Condition>, Box<Condition>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    Ref(Path),
    Literal(Value),
}

impl Condition {
    pub fn parse(text: &str) -> Result<Condition, String> {
        Condition::parse_in(text, &WORKFLOW)
    }

    /// A condition of `dialect`.
    pub fn parse_in(text: &str, dialect: &Dialect) -> Result<Condition, String> {
        let tokens = tokens(text, dialect)?;
        if tokens.is_empty() {
            return Err("is empty".into());
        }
        let mut parser = Parser { tokens: &tokens, at: 0 };
        let condition = parser.or()?;
        match parser.tokens.get(parser.at) {
            None => Ok(condition),
            Some(token) => Err(format!("unexpected {} after a complete condition", describe(token))),
        }
    }

    /// The paths it refers to.
    pub fn paths(&self) -> Vec<&Path> {
        let mut out = Vec::new();
        self.walk(&mut out);
        out
    }

    fn walk<'a>(&'a self, out: &mut Vec<&'a Path>) {
        let operand = |o: &'a Operand, out: &mut Vec<&'a Path>| {
            if let Operand::Ref(path) = o {
                out.push(path);
            }
        };
        match self {
            Condition::Value(o) => operand(o, out),
            Condition::Compare(a, _, b) => {
                operand(a, out);
                operand(b, out);
            }
            Condition::Not(c) => c.walk(out),
            Condition::And(a, b) | Condition::Or(a, b) => {
                a.walk(out);
                b.walk(out);
            }
        }
    }

    pub fn eval(&self, scope: &Value) -> Result<bool, String> {
        let value = |o: &Operand| -> Result<Value, String> {
            match o {
                Operand::Ref(path) => path.lookup(scope).cloned(),
                Operand::Literal(v) => Ok(v.clone()),
            }
        };
        Ok(match self {
            Condition::Value(o) => truthy(&value(o)?),
            Condition::Compare(a, op, b) => compare(&value(a)?, op, &value(b)?)?,
            Condition::Not(c) => !c.eval(scope)?,
            Condition::And(a, b) => a.eval(scope)? && b.eval(scope)?,
            Condition::Or(a, b) => a.eval(scope)? || b.eval(scope)?,
        })
    }
}

fn describe(token: &Token) -> String {
    match token {
        Token::Ref(path) => format!("'{{{{ {} }}}}'", path.text()),
        Token::Literal(v) => format!("'{v}'"),
        Token::Op(op) => format!("'{op}'"),
        Token::And => "'and'".into(),
        Token::Or => "'or'".into(),
        Token::Not => "'not'".into(),
        Token::Open => "'('".into(),
        Token::Close => "')'".into(),
    }
}

struct Parser<'a> {
    tokens: &'a [Token],
    at: usize,
}

impl Parser<'_> {
    fn next(&mut self) -> Option<&Token> {
        let token = self.tokens.get(self.at);
        self.at += 1;
        token
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn or(&mut self) -> Result<Condition, String> {
        let mut left = self.and()?;
        while self.peek() == Some(&Token::Or) {
            self.at += 1;
            left = Condition::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Condition, String> {
        let mut left = self.not()?;
        while self.peek() == Some(&Token::And) {
            self.at += 1;
            left = Condition::And(Box::new(left), Box::new(self.not()?));
        }
        Ok(left)
    }

    fn not(&mut self) -> Result<Condition, String> {
        if self.peek() == Some(&Token::Not) {
            self.at += 1;
            return Ok(Condition::Not(Box::new(self.not()?)));
        }
        if self.peek() == Some(&Token::Open) {
            self.at += 1;
            let inner = self.or()?;
            return match self.next() {
                Some(Token::Close) => Ok(inner),
                _ => Err("a '(' is never closed".into()),
            };
        }
        let left = self.operand()?;
        match self.peek() {
            Some(Token::Op(op)) => {
                let op = *op;
                self.at += 1;
                Ok(Condition::Compare(left, op, self.operand()?))
            }
            _ => Ok(Condition::Value(left)),
        }
    }

    fn operand(&mut self) -> Result<Operand, String> {
        match self.next() {
            Some(Token::Ref(path)) => Ok(Operand::Ref(path.clone())),
            Some(Token::Literal(value)) => Ok(Operand::Literal(value.clone())),
            Some(other) => Err(format!("expected a value or a reference, found {}", describe(other))),
            None => Err("ends where a value or a reference was expected".into()),
        }
    }
}

fn compare(a: &Value, op: &str, b: &Value) -> Result<bool, String> {
    let equal = |a: &Value, b: &Value| match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) if a.is_number() && b.is_number() => x == y,
        _ => a == b,
    };
    let member = |needle: &Value, haystack: &Value| -> Result<bool, String> {
        match haystack {
            Value::Array(items) => Ok(items.iter().any(|item| equal(needle, item))),
            Value::Object(map) => Ok(needle.as_str().is_some_and(|key| map.contains_key(key))),
            Value::String(text) => match needle {
                Value::String(part) => Ok(text.contains(part.as_str())),
                other => Err(format!("'in' a string takes a string, not {}", kind(other))),
            },
            other => Err(format!("'in' takes a list, an object or a string, not {}", kind(other))),
        }
    };
    let order = || -> Result<std::cmp::Ordering, String> {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => {
                x.as_f64().partial_cmp(&y.as_f64()).ok_or_else(|| "the numbers cannot be compared".to_string())
            }
            (Value::String(x), Value::String(y)) => Ok(x.cmp(y)),
            _ => Err(format!("'{op}' compares two numbers or two strings, not {} and {}", kind(a), kind(b))),
        }
    };
    use std::cmp::Ordering::*;
    Ok(match op {
        "==" => equal(a, b),
        "!=" => !equal(a, b),
        "<" => order()? == Less,
        "<=" => order()? != Greater,
        ">" => order()? == Greater,
        ">=" => order()? != Less,
        "in" => member(a, b)?,
        "contains" => member(b, a)?,
        other => return Err(format!("unknown operator '{other}'")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scope() -> Value {
        json!({
            "input": {"hosts": ["a", "b"], "service": "nginx", "n": 3},
            "steps": {"check": {"status": "succeeded", "result": {"healthy": false, "unhealthy": ["b"], "load": 0.7}}},
        })
    }

    fn holds(condition: &str) -> bool {
        Condition::parse(condition).unwrap_or_else(|e| panic!("{condition}: {e}")).eval(&scope()).unwrap()
    }

    #[test]
    fn a_whole_reference_keeps_its_value_and_text_takes_its_text() {
        let s = scope();
        assert_eq!(render(&json!("{{ input.hosts }}"), &s), Ok(json!(["a", "b"])));
        assert_eq!(render(&json!("{{input.n}}"), &s), Ok(json!(3)));
        assert_eq!(
            render(&json!("restart {{ input.service }} on {{ input.hosts }}"), &s),
            Ok(json!("restart nginx on [\"a\",\"b\"]"))
        );
        assert_eq!(
            render(&json!({"host": "{{ steps.check.result.unhealthy.0 }}", "n": [1, "{{ input.n }}"]}), &s),
            Ok(json!({"host": "b", "n": [1, 3]}))
        );
        assert_eq!(render(&json!(true), &s), Ok(json!(true)));
    }

    #[test]
    fn a_path_that_leads_nowhere_says_where_it_stopped() {
        let s = scope();
        assert_eq!(render(&json!("{{ input.port }}"), &s), Err("input has no 'port'".into()));
        assert_eq!(
            render(&json!("{{ steps.check.result.unhealthy.4 }}"), &s),
            Err("steps.check.result.unhealthy has 1 items, no item '4'".into())
        );
        assert_eq!(
            render(&json!("{{ input.service.name }}"), &s),
            Err("input.service is a string, which has no 'name'".into())
        );
        assert_eq!(render(&json!("{{ item }}"), &s), Err("'item' is not available here".into()));
        assert!(render(&json!("{{ nothing.x }}"), &s).unwrap_err().contains("no known root"));
        assert!(render(&json!("{{ input.x"), &s).unwrap_err().contains("never closed"));
    }

    #[test]
    fn a_secret_passes_only_whole_and_only_from_the_input() {
        let s =
            json!({"input": {"token": {"$secret": "api"}}, "steps": {"a": {"result": {"t": {"$secret": "other"}}}}});
        assert_eq!(render(&json!("{{ input.token }}"), &s), Ok(json!({"$secret": "api"})));
        assert!(render(&json!("Bearer {{ input.token }}"), &s).unwrap_err().contains("whole value"));
        let chosen = render(&json!("{{ steps.a.result.t }}"), &s).unwrap_err();
        assert!(chosen.contains("only the run's input passes one"), "{chosen}");
    }

    #[test]
    fn conditions_compare_test_membership_and_combine() {
        assert!(holds("{{ steps.check.result.healthy }} == false"));
        assert!(!holds("{{ steps.check.result.healthy }}"));
        assert!(holds("{{ steps.check.result.unhealthy }}"));
        assert!(holds("not {{ steps.check.result.healthy }}"));
        assert!(holds("{{ steps.check.status }} == 'succeeded'"));
        assert!(holds("{{ steps.check.status }} == \"succeeded\""));
        assert!(holds("{{ steps.check.status }} in ['succeeded', 'skipped']"));
        assert!(holds("{{ steps.check.result.unhealthy }} contains 'b'"));
        assert!(holds("'b' in {{ input.hosts }}"));
        assert!(holds("{{ steps.check.result.load }} > 0.5 and {{ input.n }} >= 3"));
        assert!(holds("{{ input.n }} == 3.0"));
        assert!(holds("({{ input.n }} < 1 or {{ input.n }} > 2) and not {{ input.n }} == 4"));
        assert!(holds("'ngi' in {{ input.service }}"));
        assert!(holds("{{ input.hosts }} != []"));
    }

    #[test]
    fn a_bad_condition_is_named() {
        for (condition, expected) in [
            ("", "is empty"),
            ("{{ input.n }} ==", "ends where a value"),
            ("{{ input.n }} == 3 4", "unexpected '4'"),
            ("{{ input.n }} == degraded", "'degraded' is neither a value nor an operator"),
            ("({{ input.n }} == 3", "never closed"),
            ("{{ input.n }} == 'x", "never closed"),
        ] {
            let error = Condition::parse(condition).unwrap_err();
            assert!(error.contains(expected), "{condition}: {error}");
        }
        let compared = Condition::parse("{{ input.hosts }} > 1").unwrap().eval(&scope()).unwrap_err();
        assert!(compared.contains("compares two numbers or two strings"), "{compared}");
    }
}
