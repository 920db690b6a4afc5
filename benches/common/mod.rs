//! The real `serve` for the HTTP benchmarks: started on the default model and a free loopback port,
//! killed on drop; and a JSON POST helper.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// A running `serve` and its port.
pub struct Serve(Child, pub u16);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Serve {
    /// The server's process id.
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

/// Starts `serve` with `args` after the model and port, and waits for /health.
#[allow(dead_code)]
pub fn start(args: &[&str]) -> Serve {
    let model = kvgate_server::default_model::ensure_default_model(false).expect("default model");
    start_model(&model, "smollm2-135m-instruct", args)
}

/// Starts `serve` on `model` (served as `name`) with `args`, and waits for /health.
pub fn start_model(model: &std::path::Path, name: &str, args: &[&str]) -> Serve {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_serve"))
        .args(["--model", model.to_str().unwrap(), "--served-model-name", name])
        .args(["--port", &port.to_string()])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let s = Serve(child, port);
    for _ in 0..600 {
        if ureq::get(&format!("http://127.0.0.1:{port}/health")).call().is_ok() {
            return s;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("serve did not start");
}

/// POSTs JSON and returns the JSON reply.
#[allow(dead_code)]
pub fn post(port: u16, path: &str, body: &Value) -> Value {
    let mut r = ureq::post(&format!("http://127.0.0.1:{port}{path}"))
        .send_json(body)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    r.body_mut().read_json::<Value>().unwrap()
}

/// The sum of a metric's series in `/metrics` (0 when absent or unreachable).
#[allow(dead_code)]
pub fn metric(port: u16, name: &str) -> f64 {
    ureq::get(&format!("http://127.0.0.1:{port}/metrics"))
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_to_string().ok())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
