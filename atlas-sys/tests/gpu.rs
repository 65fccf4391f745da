//! The real driver, on a machine with an NVIDIA GPU.

use std::ffi::CStr;

use atlas_sys::{CUdevice, CUresult, driver, entry};

fn check(status: CUresult, call: &str) {
    assert_eq!(
        status,
        CUresult::CUDA_SUCCESS,
        "{call} failed with code {}",
        status.0
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn driver_reports_devices_name_and_version() {
    let cuda = driver().expect("the CUDA driver loads");
    let init = entry!(cuda, cuInit).unwrap();
    let version = entry!(cuda, cuDriverGetVersion).unwrap();
    let count = entry!(cuda, cuDeviceGetCount).unwrap();
    let get = entry!(cuda, cuDeviceGet).unwrap();
    let name = entry!(cuda, cuDeviceGetName).unwrap();
    // SAFETY: each call gets pointers to live locals of the types cuda.h declares.
    unsafe {
        check(init(0), "cuInit");
        let mut v = 0;
        check(version(&mut v), "cuDriverGetVersion");
        assert!(v >= 12000, "driver version {v}");
        let mut n = 0;
        check(count(&mut n), "cuDeviceGetCount");
        assert!(n >= 1, "no CUDA device");
        let mut dev: CUdevice = -1;
        check(get(&mut dev, 0), "cuDeviceGet");
        let mut buf = [0 as std::ffi::c_char; 256];
        check(
            name(buf.as_mut_ptr(), buf.len() as i32, dev),
            "cuDeviceGetName",
        );
        let device_name = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
        assert!(!device_name.is_empty());
        println!(
            "driver {}.{}, {n} device(s), device 0: {device_name}",
            v / 1000,
            v % 1000 / 10
        );
    }
}
