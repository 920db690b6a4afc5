//! Every kernel compiles for sm_90 with NVRTC (through ptxas, to a CUBIN), so compile errors and
//! instructions sm_90 lacks fail CI without a GPU. `scripts/setup-test-deps.sh` installs the
//! `nvidia-cuda-nvrtc==13.0.88` wheel and `scripts/test.sh` puts it on the library path; there
//! `KVGATE_REQUIRE_NVRTC=1` makes a missing NVRTC a failure instead of a skip.

use kvgate_cuda::nvrtc;

#[test]
fn every_kernel_compiles_for_sm_90() {
    if !nvrtc::present() {
        assert!(
            std::env::var("KVGATE_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "KVGATE_REQUIRE_NVRTC=1 but libnvrtc.so.13 is not on the library path (run scripts/setup-test-deps.sh)"
        );
        eprintln!("SKIP: libnvrtc.so.13 not found; set LD_LIBRARY_PATH (scripts/test.sh does) to compile the kernels");
        return;
    }
    let (major, minor) = nvrtc::version().unwrap();
    eprintln!("NVRTC {major}.{minor}");
    let kernels: &[(&str, &[&str])] = &[
        (
            "kv_cache.cu",
            &[
                "store_f32",
                "store_f16",
                "store_bf16",
                "store_fp8",
                "store_nvfp4",
                "store_quant",
                "paged_attention_f32",
                "paged_attention_f16",
                "paged_attention_bf16",
                "paged_attention_e4m3",
                "paged_attention_e5m2",
                "paged_attention_nvfp4",
                "attention_merge",
            ],
        ),
        (
            "model.cu",
            &[
                "embed",
                "matmul",
                "matmul3",
                "matmul_gated",
                "add_rms_norm",
                "rope_qk",
                "rms_norm",
                "rms_norm_inplace",
                "add",
                "rope",
                "gated_act",
                "softcap",
                "gather_rows",
                "logprobs",
            ],
        ),
    ];
    assert_eq!(kernels.len(), kvgate_cuda::SOURCES.len(), "every source is checked");
    for ((name, src), (file, names)) in kvgate_cuda::SOURCES.iter().zip(kernels) {
        assert_eq!(name, file);
        let cubin = nvrtc::compile_cubin(name, src, "sm_90").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&cubin[..4], b"\x7fELF", "{name}: a CUBIN is an ELF image");
        eprintln!("{name}: {} bytes of sm_90 CUBIN", cubin.len());
        for f in names.iter() {
            assert!(
                cubin.windows(f.len()).any(|w| w == f.as_bytes()),
                "{name}: kernel {f} is in the CUBIN"
            );
        }
    }
}

#[test]
fn a_broken_kernel_fails_to_compile_with_its_log() {
    if !nvrtc::present() {
        eprintln!("SKIP: libnvrtc.so.13 not found");
        return;
    }
    let e = nvrtc::compile_cubin(
        "broken.cu",
        "extern \"C\" __global__ void k() { undefined_thing(); }",
        "sm_90",
    )
    .unwrap_err();
    assert!(e.to_string().contains("undefined_thing"), "{e}");
    // An instruction sm_90 does not have (hardware e2m1 conversion, Blackwell only) is refused by ptxas.
    let src = r#"extern "C" __global__ void k(unsigned int* o, float a, float b) {
        unsigned int r;
        asm("{\n .reg .b8 q;\n cvt.rn.satfinite.e2m1x2.f32 q, %1, %2;\n cvt.u32.u8 %0, q;\n}" : "=r"(r) : "f"(a), "f"(b));
        *o = r; }"#;
    let on_blackwell = nvrtc::compile_cubin("e2m1.cu", src, "sm_100a");
    assert!(on_blackwell.is_ok(), "the probe itself is valid PTX: {on_blackwell:?}");
    let e = nvrtc::compile_cubin("e2m1.cu", src, "sm_90").unwrap_err().to_string();
    assert!(e.contains("e2m1x2") && e.contains("not supported"), "{e}");
}

#[test]
fn compiled_kernels_are_kept_on_disk_keyed_by_source() {
    use kvgate_cuda::cubin_cache::compile_in;
    if !nvrtc::present() {
        eprintln!("SKIP: libnvrtc.so.13 not found");
        return;
    }
    let dir = std::env::temp_dir().join(format!("kvgate-cubin-cache-{}", std::process::id()));
    let d = Some(dir.as_path());
    let src = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }";
    let a = compile_in(d, "probe.cu", src, "sm_90").unwrap();
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(files.len(), 1, "one CUBIN stored: {files:?}");
    assert_eq!(std::fs::read(&files[0]).unwrap(), a);
    // the second call reads it back (a marker written over it shows it was not recompiled)
    let mut marked = a.clone();
    marked.extend_from_slice(b"cached");
    std::fs::write(&files[0], &marked).unwrap();
    assert_eq!(compile_in(d, "probe.cu", src, "sm_90").unwrap(), marked);
    // another source is another file; a file that is not a CUBIN is compiled over
    let other = src.replace("1.0f", "2.0f");
    compile_in(d, "probe.cu", &other, "sm_90").unwrap();
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    std::fs::write(&files[0], b"garbage").unwrap();
    assert_eq!(compile_in(d, "probe.cu", src, "sm_90").unwrap(), a);
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `KVGATE_CUBIN_CACHE` set (scripts/build-device-bundle.sh sets it to device-bundle/cubin), every
/// source's CUBIN is compiled into that cache, so the device machine loads them instead of compiling.
#[test]
fn every_source_compiles_into_the_cache() {
    if !nvrtc::present() || std::env::var_os("KVGATE_CUBIN_CACHE").is_none() {
        eprintln!("SKIP: needs libnvrtc.so.13 and KVGATE_CUBIN_CACHE");
        return;
    }
    let cubins = kvgate_cuda::cubins().unwrap();
    assert_eq!(cubins.len(), kvgate_cuda::SOURCES.len());
    eprintln!("cached in {:?}", kvgate_cuda::cubin_cache::dir());
}
