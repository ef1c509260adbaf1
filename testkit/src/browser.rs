//! A real headless browser for the dashboard's tests: Debian's `chromium`, driven through
//! `chromedriver` with the W3C WebDriver protocol (plain JSON over HTTP, spoken with `reqwest`).
//!
//! [`Browser::start`] starts `chromedriver` on a free port and opens a session with a fresh
//! profile directory; dropping the browser closes the session, kills the driver and removes the
//! profile. Waits poll the page with a deadline and report what the page showed when they time
//! out; nothing sleeps to synchronise. A missing browser is a test failure that names the binary
//! (there is no silent skip): `scripts/test.sh` installs `chromium` and `chromium-driver`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The key under which WebDriver returns an element reference.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long a wait polls before it fails.
pub const WAIT: Duration = Duration::from_secs(30);

pub struct Browser {
    http: reqwest::Client,
    /// `http://127.0.0.1:<port>/session/<id>`
    session: String,
    driver: Child,
    profile: PathBuf,
}

fn binary(variable: &str, default: &str, package: &str) -> PathBuf {
    let path = PathBuf::from(std::env::var(variable).unwrap_or_else(|_| default.to_string()));
    assert!(
        path.is_file(),
        "BROWSER TESTS CANNOT RUN: {} is missing. Install Debian's `{package}` package \
         (`apt-get install -y chromium chromium-driver`; `scripts/test.sh` does) or point {variable} at it.",
        path.display()
    );
    path
}

impl Browser {
    /// Starts chromedriver and a headless chromium session (1400×1000).
    pub async fn start() -> Browser {
        let chromium = binary("ATTUNE_CHROMIUM", "/usr/bin/chromium", "chromium");
        let chromedriver = binary("ATTUNE_CHROMEDRIVER", "/usr/bin/chromedriver", "chromium-driver");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let profile =
            std::env::temp_dir().join(format!("attune-chromium-{}-{:x}", std::process::id(), rand::random::<u32>()));
        std::fs::create_dir_all(&profile).unwrap();
        let log = std::fs::File::create(profile.with_extension("driver.log")).unwrap();
        // its own process group, so that chromium, its child, goes with it (see Drop)
        let driver = Command::new(&chromedriver)
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display()));
        let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let mut browser = Browser { http, session: String::new(), driver, profile };
        crate::wait_for("chromedriver to be ready", WAIT, || {
            let (http, status) = (browser.http.clone(), format!("{base}/status"));
            async move {
                let body: Value = http.get(status).send().await.ok()?.json().await.ok()?;
                (body["value"]["ready"] == true).then_some(())
            }
        })
        .await;
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1400,1000",
            "--hide-scrollbars",
        ]
        .iter()
        .map(|a| a.to_string())
        .chain([format!("--user-data-dir={}", browser.profile.display())])
        .collect::<Vec<_>>();
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let created = browser.call(reqwest::Method::POST, &format!("{base}/session"), Some(capabilities)).await;
        let id = created["sessionId"].as_str().unwrap_or_else(|| panic!("no session id in {created}"));
        browser.session = format!("{base}/session/{id}");
        browser
    }

    /// One WebDriver command; panics with the driver's error (the `value` on success).
    async fn call(&self, method: reqwest::Method, url: &str, body: Option<Value>) -> Value {
        match self.try_call(method, url, body).await {
            Ok(value) => value,
            Err(error) => panic!("webdriver {url}: {error}"),
        }
    }

    async fn try_call(&self, method: reqwest::Method, url: &str, body: Option<Value>) -> Result<Value, Value> {
        let mut request = self.http.request(method, url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| json!({"error": "transport", "message": e.to_string()}))?;
        let ok = response.status().is_success();
        let body: Value = response.json().await.map_err(|e| json!({"error": "body", "message": e.to_string()}))?;
        let value = body.get("value").cloned().unwrap_or(Value::Null);
        if ok { Ok(value) } else { Err(value) }
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        self.call(method, &format!("{}{path}", self.session), body).await
    }

    /// Loads `url` and waits for the document to finish loading.
    pub async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({"url": url}))).await;
    }

    /// The address the browser shows now.
    pub async fn url(&self) -> String {
        self.command(reqwest::Method::GET, "/url", None).await.as_str().unwrap_or_default().to_string()
    }

    /// Runs `script` (a function body: `return ...`) in the page and returns its value.
    pub async fn eval(&self, script: &str) -> Value {
        self.command(reqwest::Method::POST, "/execute/sync", Some(json!({"script": script, "args": []}))).await
    }

    /// The element matching `css`, if there is one now.
    async fn find(&self, css: &str) -> Option<String> {
        let found = self
            .try_call(
                reqwest::Method::POST,
                &format!("{}/element", self.session),
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        match found {
            Ok(element) => element[ELEMENT_KEY].as_str().map(str::to_string),
            Err(error) if error["error"] == "no such element" => None,
            Err(error) => panic!("webdriver find {css}: {error}"),
        }
    }

    /// Polls `script` until it returns something other than `null`, `false`, `""` or `[]`, and
    /// returns that; after [`WAIT`] panics naming `what`, with the page's address and text.
    pub async fn wait(&self, what: &str, script: &str) -> Value {
        let started = Instant::now();
        loop {
            let value = self.eval(script).await;
            let empty = matches!(&value, Value::Null | Value::Bool(false))
                || value.as_str() == Some("")
                || value.as_array().is_some_and(|a| a.is_empty());
            if !empty {
                return value;
            }
            if started.elapsed() > WAIT {
                let page = self.eval("return document.body ? document.body.innerText : ''").await;
                panic!(
                    "timed out after {WAIT:?} waiting for {what} on {}; the page shows:\n{}",
                    self.url().await,
                    text(&page)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for an element matching `css` and runs `command` on it (`/element/<id>` + `suffix`).
    /// A page that re-renders between finding and acting makes the reference stale: find again.
    async fn on_element(&self, css: &str, method: reqwest::Method, suffix: &str, body: Option<Value>) -> Value {
        let selector = serde_json::to_string(css).unwrap();
        let present = format!("return document.querySelector({selector}) !== null");
        let started = Instant::now();
        loop {
            assert!(started.elapsed() < WAIT, "no element matching {css} could be acted on within {WAIT:?}");
            self.wait(&format!("an element matching {css}"), &present).await;
            if let Some(element) = self.find(css).await {
                let url = format!("{}/element/{element}{suffix}", self.session);
                match self.try_call(method.clone(), &url, body.clone()).await {
                    Ok(value) => return value,
                    Err(error) if error["error"] == "stale element reference" && started.elapsed() < WAIT => {}
                    Err(error) => panic!("webdriver {suffix} on {css}: {error}"),
                }
            }
        }
    }

    /// Waits for the element matching `css` and clicks it, as a user would.
    pub async fn click(&self, css: &str) {
        self.on_element(css, reqwest::Method::POST, "/click", Some(json!({}))).await;
    }

    /// Waits for the input matching `css`, clears it and types `text` into it.
    pub async fn type_into(&self, css: &str, text: &str) {
        self.on_element(css, reqwest::Method::POST, "/clear", Some(json!({}))).await;
        self.on_element(css, reqwest::Method::POST, "/value", Some(json!({"text": text}))).await;
    }

    /// The rendered text of the element matching `css` (waits for it).
    pub async fn text(&self, css: &str) -> String {
        text(&self.on_element(css, reqwest::Method::GET, "/text", None).await)
    }

    /// The whole page's rendered text.
    pub async fn page_text(&self) -> String {
        text(&self.eval("return document.body.innerText").await)
    }

    /// The browser console's errors (script exceptions, CSP violations, failed requests) since
    /// the last call, as text lines.
    pub async fn console_errors(&self) -> Vec<String> {
        let entries = self.command(reqwest::Method::POST, "/se/log", Some(json!({"type": "browser"}))).await;
        entries
            .as_array()
            .map(|entries| {
                entries
                    .iter()
                    .filter(|e| e["level"] == "SEVERE")
                    .map(|e| e["message"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Writes a PNG of the whole page (the window grown to the page's height, then restored).
    pub async fn screenshot(&self, path: &Path) {
        // the window's height includes what is not the page (outer minus inner height)
        let size =
            self.eval("return [document.documentElement.scrollHeight, window.outerHeight - window.innerHeight]").await;
        let height = (size[0].as_i64().unwrap_or(1000) + size[1].as_i64().unwrap_or(0)).clamp(600, 4000);
        self.command(reqwest::Method::POST, "/window/rect", Some(json!({"width": 1400, "height": height}))).await;
        let png = self.command(reqwest::Method::GET, "/screenshot", None).await;
        self.command(reqwest::Method::POST, "/window/rect", Some(json!({"width": 1400, "height": 1000}))).await;
        let bytes =
            decode_base64(png.as_str().expect("screenshot is base64 text")).expect("screenshot is valid base64");
        assert!(bytes.starts_with(b"\x89PNG"), "the screenshot is not a PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

impl Drop for Browser {
    fn drop(&mut self) {
        // end the session first so chromedriver closes chromium, then stop the driver
        if !self.session.is_empty() {
            let (http, session) = (self.http.clone(), self.session.clone());
            let _ = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                runtime.block_on(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(10), http.delete(session).send()).await;
                });
            })
            .join();
        }
        // the whole group: chromium too, should the session not have ended in time. pkill -g,
        // not `kill -KILL -<pgid>`: procps-ng 4.0.2's kill parses that as every process (signal 0
        // to a group that does not exist succeeds), and as root it stopped PostgreSQL, RabbitMQ
        // and everything else
        let _ = Command::new("pkill").args(["-KILL", "-g", &self.driver.id().to_string()]).status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
        let log = self.profile.with_extension("driver.log");
        if std::thread::panicking() {
            eprintln!("chromedriver's log is kept in {}", log.display());
        } else {
            let _ = std::fs::remove_file(log);
        }
    }
}

/// Standard base64 (RFC 4648, with or without padding). The workspace has a base64 crate only as
/// a dependency of sqlx; a screenshot is not worth a dependency edit shared with every crate.
pub fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for byte in text.bytes().filter(|b| !b.is_ascii_whitespace()) {
        let value = match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        buffer = (buffer << 6) | value as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::decode_base64;

    #[test]
    fn base64_decodes_padded_and_unpadded_text() {
        assert_eq!(decode_base64("").unwrap(), b"");
        assert_eq!(decode_base64("Zg==").unwrap(), b"f");
        assert_eq!(decode_base64("Zm8=").unwrap(), b"fo");
        assert_eq!(decode_base64("Zm9v").unwrap(), b"foo");
        assert_eq!(decode_base64("Zm9vYg").unwrap(), b"foob");
        assert_eq!(decode_base64("iVBORw0K\nGgo=").unwrap(), b"\x89PNG\r\n\x1a\n");
        assert_eq!(decode_base64("+/+/").unwrap(), [0xfb, 0xff, 0xbf]);
        assert!(decode_base64("Zm9v!").is_none());
    }
}
