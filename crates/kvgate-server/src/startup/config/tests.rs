//! The configuration's tests: precedence, every setting type's parser, the file format.

use super::values::parse_bytes;
use super::*;
use kvgate_kv::KvDtype;

#[test]
fn defaults_match_the_spec() {
    let a = load(["serve"]).unwrap();
    assert_eq!((a.host.as_str(), a.port), ("127.0.0.1", 8000));
    assert!(a.allowed_origins.is_empty());
    assert_eq!(a.allowed_methods, vec!["*"]);
    assert_eq!(a.block_size, 16);
    assert!(a.enable_prefix_caching);
    assert_eq!(
        (a.max_num_seqs, a.max_num_batched_tokens, a.max_queue),
        (256, 2048, 1024)
    );
    assert_eq!(a.shutdown_timeout, 30);
    assert_eq!(a.max_request_body.bytes(), 32 << 20);
    assert_eq!(a.kv_cache_dtype, KvCacheDtype::Auto);
    assert_eq!((a.device, a.log_format), (Device::Cpu, LogFormat::Text));
}

#[test]
fn lists_take_json_or_repeats() {
    let a = load([
        "serve",
        "--allowed-origins",
        "[\"https://a.example\",\"http://b:3000\"]",
    ])
    .unwrap();
    assert_eq!(a.allowed_origins, vec!["https://a.example", "http://b:3000"]);
    let b = load([
        "serve",
        "--allowed-origins",
        "https://a.example",
        "--allowed-origins",
        "http://b:3000",
    ])
    .unwrap();
    assert_eq!(a.allowed_origins, b.allowed_origins);
    assert!(load(["serve", "--allowed-origins", "*", "--allow-credentials"]).is_err());
    assert!(
        !load(["serve", "--no-enable-prefix-caching"])
            .unwrap()
            .enable_prefix_caching
    );
}

#[test]
fn typed_settings_parse_once_and_name_the_flag() {
    let a = load([
        "serve",
        "--kv-cache-dtype",
        "fp8",
        "--device",
        "cuda:1",
        "--log-format",
        "json",
        "--kv-cache-memory",
        "512MiB",
    ])
    .unwrap();
    assert_eq!(a.kv_cache_dtype, KvCacheDtype::Fixed(KvDtype::Fp8E4m3));
    assert_eq!(a.device, Device::Cuda(1));
    assert_eq!(a.log_format, LogFormat::Json);
    assert_eq!(a.kv_cache_memory.map(ByteSize::bytes), Some(512 << 20));
    // auto is float32 on the CPU, bfloat16 on a GPU; a fixed dtype is itself everywhere
    assert_eq!(KvCacheDtype::Auto.resolve(Device::Cpu), KvDtype::F32);
    assert_eq!(KvCacheDtype::Auto.resolve(Device::Cuda(0)), KvDtype::BF16);
    assert_eq!(a.kv_cache_dtype.resolve(Device::Cpu), KvDtype::Fp8E4m3);
    assert_eq!(a.gpu_memory_utilization, 0.9);
    for v in ["0", "1.5", "-0.1", "nan"] {
        let arg = format!("--gpu-memory-utilization={v}");
        let e = load(["serve", arg.as_str()]).unwrap_err().to_string();
        assert!(
            e.contains("gpu-memory-utilization") && e.contains("at most 1"),
            "{v}: {e}"
        );
    }
    let a = load(["serve", "--kv-shared", "redis://cache:6379/2", "--kv-shared-ttl", "600"]).unwrap();
    assert_eq!(
        (a.kv_shared.as_deref(), a.kv_shared_ttl, a.kv_shared_timeout),
        (Some("redis://cache:6379/2"), 600, 2000)
    );
    let a = load(["serve", "--gpu-memory-utilization", "0.5"]).unwrap();
    assert_eq!(a.gpu_memory_utilization, 0.5);
    for (flag, value) in [
        ("--kv-cache-dtype", "int3"),
        ("--device", "tpu"),
        ("--device", "cuda:x"),
        ("--log-format", "xml"),
        ("--max-request-body", "2 parsecs"),
        ("--kv-shared", "http://cache:6379"),
        ("--kv-shared-timeout", "0"),
        ("--kv-shared-ttl", "0"),
    ] {
        let e = load(["serve", flag, value]).unwrap_err().to_string();
        assert!(e.contains(flag) && e.contains(value), "{e}");
    }
    // the config file goes through the same types
    let dir = std::env::temp_dir().join(format!("kvgate-cfg-typed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("c.toml");
    std::fs::write(&f, "kv-cache-dtype = \"nvfp4\"\nmax-request-body = \"1KiB\"\n").unwrap();
    let a = load(["serve", "--config", f.to_str().unwrap()]).unwrap();
    assert_eq!(a.kv_cache_dtype, KvCacheDtype::Fixed(KvDtype::Nvfp4));
    assert_eq!(a.max_request_body.bytes(), 1024);
    std::fs::write(&f, "device = \"gpu\"\n").unwrap();
    let e = load(["serve", "--config", f.to_str().unwrap()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("gpu"), "{e}");
}

#[test]
fn sizes() {
    assert_eq!(parse_bytes("2GiB").unwrap(), 2 << 30);
    assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
    assert_eq!(parse_bytes("1000").unwrap(), 1000);
    assert!(parse_bytes("2 parsecs").is_err());
}

#[test]
fn file_below_flags() {
    let dir = std::env::temp_dir().join(format!("kvgate-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("c.toml");
    std::fs::write(
        &f,
        "port = 9001\nmax-num-seqs = 7\nallowed-origins = [\"https://x.example\"]\n",
    )
    .unwrap();
    let a = load(["serve", "--config", f.to_str().unwrap(), "--port", "9100"]).unwrap();
    assert_eq!(a.port, 9100, "flag beats file");
    assert_eq!(a.max_num_seqs, 7, "file beats default");
    assert_eq!(a.allowed_origins, vec!["https://x.example"]);
    std::fs::write(&f, "prot = 1\n").unwrap();
    assert!(
        load(["serve", "--config", f.to_str().unwrap()]).is_err(),
        "unknown keys are refused"
    );
}

#[test]
fn decision_temperature_is_auto_unless_given() {
    use kvgate_decide::DecisionTemperature;
    let a = load(["serve"]).unwrap();
    assert_eq!(a.decision_temperature, DecisionTemperatureSetting::Auto);
    let fitted: DecisionTemperature = "noul=1,choice=0.5,score=2".parse().unwrap();
    assert_eq!(a.decision_temperature.resolve(Some(fitted)), fitted);
    assert_eq!(a.decision_temperature.resolve(None), DecisionTemperature::DEFAULT);
    let b = load(["serve", "--decision-temperature", "choice=0.7"]).unwrap();
    let fixed = b.decision_temperature.resolve(Some(fitted));
    assert_eq!(
        (fixed.noul, fixed.choice, fixed.score),
        (1.0, 0.7, 1.0),
        "a given one wins"
    );
    assert_eq!(DecisionTemperatureSetting::Auto.to_string(), "auto");
    assert!(load(["serve", "--decision-temperature", "warm"]).is_err());
}

#[test]
fn chat_template_is_a_path_or_the_template_itself() {
    let a = load(["serve"]).unwrap();
    assert_eq!(a.chat_template, None);
    let inline = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}";
    let a = load(["serve", "--chat-template", inline]).unwrap();
    assert_eq!(a.chat_template, Some(ChatTemplateSetting::Inline(inline.into())));
    assert_eq!(a.chat_template.unwrap().source().unwrap(), inline);
    let a = load(["serve", "--chat-template", "templates/gemma.jinja"]).unwrap();
    assert_eq!(
        a.chat_template,
        Some(ChatTemplateSetting::File("templates/gemma.jinja".into()))
    );
    let missing = ChatTemplateSetting::File("/nonexistent/t.jinja".into()).source();
    assert!(missing.unwrap_err().contains("/nonexistent/t.jinja"));
    assert!(load(["serve", "--chat-template", " "]).is_err());
    // the TOML file takes the same values
    let dir = std::env::temp_dir().join(format!("kvgate-tmpl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("c.toml");
    std::fs::write(&cfg, "chat-template = \"t.jinja\"\n").unwrap();
    let a = load(["serve", "--config", cfg.to_str().unwrap()]).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(a.chat_template, Some(ChatTemplateSetting::File("t.jinja".into())));
}
