//! Compiling kernels with NVRTC to a CUBIN for a real architecture (`sm_90`). A CUBIN goes through
//! ptxas, so syntax errors and instructions the architecture lacks fail here, on any machine that can
//! load `libnvrtc` — no GPU needed (CI does this with the `nvidia-cuda-nvrtc` wheel).

use std::ffi::{CStr, CString};

use cudarc::nvrtc::{result, sys};

use crate::CudaError;

/// Whether `libnvrtc` can be loaded.
pub fn present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version, `(major, minor)`.
pub fn version() -> Result<(i32, i32), CudaError> {
    if !present() {
        return Err(CudaError::NoNvrtc);
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; the out-pointers are valid for the call.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Driver(format!("nvrtcVersion: {r:?}")));
    }
    Ok((major, minor))
}

/// Compiles `src` (named `file` in messages) to a CUBIN for `arch` (e.g. `sm_90`).
pub fn compile_cubin(file: &str, src: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    if !present() {
        return Err(CudaError::NoNvrtc);
    }
    let fail = |log: String| CudaError::Compile {
        file: file.to_string(),
        arch: arch.to_string(),
        log,
    };
    let csrc = CString::new(src).map_err(|e| fail(e.to_string()))?;
    let cname = CString::new(file).map_err(|e| fail(e.to_string()))?;
    let prog = result::create_program(&csrc, Some(&cname)).map_err(|e| fail(format!("{e:?}")))?;
    let opts = [format!("--gpu-architecture={arch}"), "--std=c++17".to_string()];
    // SAFETY: `prog` is a live program from create_program; it is destroyed on every path below.
    unsafe {
        if let Err(e) = result::compile_program(prog, &opts) {
            let log = result::get_program_log(prog)
                .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
                .unwrap_or_default();
            let _ = result::destroy_program(prog);
            return Err(fail(format!("{e:?}\n{log}")));
        }
        let mut size = 0usize;
        if sys::nvrtcGetCUBINSize(prog, &mut size) != sys::nvrtcResult::NVRTC_SUCCESS {
            let _ = result::destroy_program(prog);
            return Err(fail("nvrtcGetCUBINSize failed".into()));
        }
        let mut buf = vec![0u8; size];
        if sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _) != sys::nvrtcResult::NVRTC_SUCCESS {
            let _ = result::destroy_program(prog);
            return Err(fail("nvrtcGetCUBIN failed".into()));
        }
        let _ = result::destroy_program(prog);
        Ok(buf)
    }
}
