//! The seed's SQL (the Phase 3 quick reference, `testkit/fixtures/phase3-quickref.txt`) as its
//! text writes it: read by the operators' `seed_sql` test, which runs each statement against a
//! real run, and by the tidy check that the book's quick reference holds every one of them.

/// The SQL statements of the text: from a line starting with SELECT or WITH (or a `psql -c "`
/// line followed by one) to the first `;`.
pub fn statements(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        let line = trimmed.strip_prefix("psql -c \"").unwrap_or(trimmed);
        if current.is_none() {
            if !(line.starts_with("SELECT") || line.starts_with("WITH")) {
                continue;
            }
            current = Some(String::new());
        }
        let statement = current.as_mut().unwrap();
        if let Some(end) = line.find(';') {
            statement.push_str(&line[..=end]);
            out.push(std::mem::take(statement));
            current = None;
        } else {
            statement.push_str(line);
            statement.push('\n');
        }
    }
    out
}
