//! A real browser against the real server: headless Chromium (Debian's `chromium`, installed by
//! `scripts/setup-test-deps.sh`) opens a page served from another loopback origin that calls the API with
//! `fetch()`. By default the browser refuses to hand the page the response; once the page's origin is
//! listed it works; with a wrong key the page can show a readable 401 instead of an opaque CORS failure.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;

use common::Server;

fn page(api: &str, key: Option<&str>) -> String {
    let auth = key
        .map(|k| format!("headers: {{'Authorization': 'Bearer {k}'}},"))
        .unwrap_or_default();
    format!(
        r#"<!doctype html><html><body><pre id="out">pending</pre><script>
        fetch('{api}/v1/models', {{ {auth} }})
          .then(async r => {{
            const body = await r.json();
            document.getElementById('out').textContent = r.ok
              ? 'RESULT OK ' + body.data[0].id
              : 'RESULT HTTP ' + r.status + ': ' + body.error.message;
          }})
          .catch(e => {{ document.getElementById('out').textContent = 'RESULT BLOCKED ' + e; }});
        </script></body></html>"#
    )
}

fn chromium() -> &'static str {
    for c in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if std::path::Path::new(c).exists() {
            return c;
        }
    }
    panic!("Chromium is not installed: run scripts/setup-test-deps.sh (it installs Debian's chromium)");
}

/// Loads the page in headless Chromium and returns what the page wrote.
fn run_page(url: &str) -> String {
    let profile = std::env::temp_dir().join(format!("kvgate-chromium-{}-{}", std::process::id(), url.len()));
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=15000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(url)
        .output()
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(&profile);
    let dom = String::from_utf8_lossy(&out.stdout).to_string();
    let start = dom.find("RESULT").unwrap_or_else(|| {
        panic!(
            "the page did not finish: {dom}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    dom[start..].split('<').next().unwrap_or("").to_string()
}

#[test]
fn browser_sees_cors_policy_and_readable_401() {
    // The page's origin must be known before the server starts, so its HTML is set afterwards.
    let ui = serve_page();
    // Default: no origin allowed.
    let s = Server::start(&[]);
    ui.set(page(&s.url(""), None));
    let r = run_page(&format!("{}/", ui.origin));
    assert!(r.starts_with("RESULT BLOCKED"), "refused by default: {r}");
    drop(s);
    // The page's origin listed: the same call works.
    let s = Server::start(&["--allowed-origins", &ui.origin, "--api-key", "right-key"]);
    ui.set(page(&s.url(""), Some("right-key")));
    let r = run_page(&format!("{}/", ui.origin));
    assert_eq!(r.trim(), "RESULT OK smollm2-135m-instruct", "listed origin works");
    // A wrong key: a readable 401, not an opaque CORS failure.
    ui.set(page(&s.url(""), Some("wrong-key")));
    let r = run_page(&format!("{}/index.html", ui.origin));
    assert!(r.starts_with("RESULT HTTP 401: Unauthorized"), "{r}");
}

/// A one-page HTTP server on a free loopback port (another origin than the API); its HTML can be set
/// after it started.
struct LazyPage {
    origin: String,
    html: std::sync::Arc<std::sync::Mutex<String>>,
}

impl LazyPage {
    fn set(&self, html: String) {
        *self.html.lock().unwrap() = html;
    }
}

fn serve_page() -> LazyPage {
    let html = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = html.clone();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let body = if buf.starts_with(b"GET / ") || buf.starts_with(b"GET /index") {
                h.lock().unwrap().clone()
            } else {
                String::new()
            };
            let status = if body.is_empty() { "404 Not Found" } else { "200 OK" };
            let _ = write!(
                c,
                "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    LazyPage {
        origin: format!("http://127.0.0.1:{port}"),
        html,
    }
}
