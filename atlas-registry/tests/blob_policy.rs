//! The policy of blob validation (RELIABILITY.md, "Blob validation"), on inputs built here: the
//! entries a device may pick decide a fatbin's checks and its parameter layouts; bytes of no
//! format Atlas knows go to the driver only through the unsafe opt-in; inputs built to make
//! validation and layout reading quadratic get their verdicts in linear time.
//!
//! The load paths run against the stand-in libcuda (`tests/support/standin/`), each in a child
//! process; no GPU is needed.

mod support;

use atlas_kernels::{ELEMENTWISE_FATBIN, cubin_for_model};
use atlas_registry::{
    AtlasError, AtlasLibrary, AtlasRegistry, BlobKind, DeviceBuffer, LaunchConfig,
    ptx_kernel_layouts, validate_blob, validate_blob_for_device,
};
use support::child;
use support::standin::{self, probe};

child::bodies!(
    layouts_come_from_every_entry_the_driver_may_pick,
    a_broken_entry_of_another_architecture_loads,
    a_broken_entry_of_the_device_is_refused_before_the_driver,
    unknown_formats_load_only_when_asked_unsafely,
);

/// A fatbin of `entries`, each `(kind, arch, code)` stored plain (flags 0x11, 64-byte headers).
fn fatbin(entries: &[(u16, u32, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for &(kind, arch, code) in entries {
        let payload = code.len().div_ceil(8) * 8;
        let mut header = [0u8; 64];
        header[0..2].copy_from_slice(&kind.to_le_bytes());
        header[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
        header[4..8].copy_from_slice(&64u32.to_le_bytes());
        header[8..16].copy_from_slice(&(payload as u64).to_le_bytes());
        header[28..32].copy_from_slice(&arch.to_le_bytes());
        header[40..48].copy_from_slice(&0x11u64.to_le_bytes());
        body.extend_from_slice(&header);
        body.extend_from_slice(code);
        body.resize(body.len() + payload - code.len(), 0);
    }
    let mut b = 0xBA55_ED50u32.to_le_bytes().to_vec();
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&16u16.to_le_bytes());
    b.extend_from_slice(&(body.len() as u64).to_le_bytes());
    b.extend_from_slice(&body);
    b
}

/// The committed sm_`sm` cubin of the demo's `elementwise` module.
fn elementwise_cubin(sm: u32) -> &'static [u8] {
    cubin_for_model("demo", sm)
        .unwrap()
        .iter()
        .find(|(name, _)| *name == "elementwise")
        .unwrap()
        .1
}

/// PTX for sm_75 whose `scale` takes one `u32`: not the `scale(float*, float, u32)` of the cubins.
const ONE_ARGUMENT_SCALE: &[u8] = b".version 8.0\n.target sm_75\n.address_size 64\n\
    .visible .entry scale(.param .u32 n) { ret; }\n\0";

// ---------------------------------------------------------------------------------------------
// Layouts from the code the driver may load
// ---------------------------------------------------------------------------------------------

#[test]
fn without_param_info_a_fatbin_whose_entries_disagree_has_no_layout() {
    standin::run(
        layouts_come_from_every_entry_the_driver_may_pick,
        &["-DSTANDIN_NO_PARAM_INFO"],
    );
}

/// The driver may load the PTX or the sm_90 cubin of a fatbin for an sm_90 device (the PTX under
/// `CUDA_FORCE_PTX_JIT`). A registry hands it the cubin alone, so the layout is the cubin's; a
/// library hands it the whole fatbin, and when the entries declare different layouts for
/// `scale`, a typed launch is refused, whichever the driver picked (the layout once came from the
/// first entry, the PTX, and a one-argument launch reached the driver). When they agree, the
/// layout is theirs.
fn layouts_come_from_every_entry_the_driver_may_pick() {
    let disagreeing = fatbin(&[(1, 75, ONE_ARGUMENT_SCALE), (2, 90, elementwise_cubin(90))]);
    let registry = AtlasRegistry::load(0, &[("elementwise", &disagreeing)]).unwrap();
    let scale = registry.function("elementwise", "scale").unwrap();
    assert_eq!(scale.param_sizes().unwrap(), Some(&[8, 4, 4][..]));
    let stream = registry.stream();
    // SAFETY: refused before the driver is called (one argument for three parameters); were it
    // launched, the kernel would read three parameters from an array of one.
    let e =
        unsafe { scale.launch(stream, &LaunchConfig::for_elements(16, 16), (16u32,)) }.unwrap_err();
    assert!(matches!(e, AtlasError::InvalidLaunch { .. }), "{e}");
    assert_eq!(probe().launches(), 0, "the driver saw the launch");

    // An sm_80 cubin is never picked for sm_90: its layout does not matter.
    let other_arch = fatbin(&[(2, 80, ONE_ARGUMENT_SCALE), (2, 90, elementwise_cubin(90))]);
    let registry = AtlasRegistry::load(0, &[("elementwise", &other_arch)]).unwrap();
    let scale = registry.function("elementwise", "scale").unwrap();
    assert_eq!(scale.param_sizes().unwrap(), Some(&[8, 4, 4][..]));

    // The committed fatbin: compute_75 PTX and sm_90 SASS agree.
    let registry = AtlasRegistry::load(0, &[("elementwise", ELEMENTWISE_FATBIN)]).unwrap();
    let scale = registry.function("elementwise", "scale").unwrap();
    assert_eq!(scale.param_sizes().unwrap(), Some(&[8, 4, 4][..]));
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &[1.0f32; 16]).unwrap();
    // SAFETY: refused before the driver is called (two arguments for three parameters).
    let e = unsafe {
        scale.launch(
            stream,
            &LaunchConfig::for_elements(16, 16),
            (&mut x, 2.0f32),
        )
    }
    .unwrap_err();
    assert!(matches!(e, AtlasError::InvalidLaunch { .. }), "{e}");

    // One load for every device reads them per device, from the same entries.
    let library = AtlasLibrary::load(&[("elementwise", &disagreeing)]).unwrap();
    let registry = library.registry(0).unwrap();
    let scale = registry.function("elementwise", "scale").unwrap();
    assert_eq!(scale.param_sizes().unwrap(), None);
    // SAFETY: refused before the driver is called (no layout to check against).
    let e = unsafe {
        scale.launch(
            registry.stream(),
            &LaunchConfig::for_elements(16, 16),
            (16u32,),
        )
    }
    .unwrap_err();
    assert!(matches!(e, AtlasError::ParamsUnknown { .. }), "{e}");
    assert!(e.to_string().contains("different parameter layouts"), "{e}");
    assert_eq!(probe().launches(), 0, "the driver saw the launch");
}

// ---------------------------------------------------------------------------------------------
// Which entries are checked at load
// ---------------------------------------------------------------------------------------------

/// The committed fatbin with its sm_`sm` cubin's section header table moved past its end.
fn with_broken_cubin(sm: u32) -> Vec<u8> {
    let mut b = ELEMENTWISE_FATBIN.to_vec();
    let cubin = elementwise_cubin(sm);
    let at = b
        .windows(cubin.len())
        .position(|w| w == cubin)
        .expect("the committed fatbin holds the committed cubins");
    b[at + 40..at + 48].copy_from_slice(&u64::MAX.to_le_bytes());
    b
}

#[test]
fn a_broken_cubin_the_device_never_picks_does_not_sink_its_fatbin() {
    standin::run(a_broken_entry_of_another_architecture_loads, &[]);
}

fn a_broken_entry_of_another_architecture_loads() {
    let broken = with_broken_cubin(80);
    assert!(validate_blob("elementwise", &broken).is_err());
    assert_eq!(
        validate_blob_for_device("elementwise", &broken, (9, 0)).unwrap(),
        BlobKind::Fatbin
    );
    let registry = AtlasRegistry::load(0, &[("elementwise", &broken)]).unwrap();
    assert_eq!(registry.module_kind("elementwise"), Some(BlobKind::Fatbin));
    AtlasLibrary::load(&[("elementwise", &broken)]).unwrap();
}

#[test]
fn a_broken_cubin_the_device_may_pick_is_refused_before_the_driver() {
    standin::run(
        a_broken_entry_of_the_device_is_refused_before_the_driver,
        &["-DSTANDIN_CC_MAJOR=8"],
    );
}

/// On sm_80 devices, the sm_80 cubin may be picked: refused, by the registry and by the library
/// (for the devices present), before the driver loads anything, as the pure check refuses it.
fn a_broken_entry_of_the_device_is_refused_before_the_driver() {
    let broken = with_broken_cubin(80);
    let expected = validate_blob_for_device("elementwise", &broken, (8, 0)).unwrap_err();
    let e = AtlasRegistry::load(0, &[("elementwise", &broken)]).unwrap_err();
    assert_eq!(e.to_string(), expected.to_string());
    assert!(e.to_string().contains("ELF sm_80"), "{e}");
    let e = AtlasLibrary::load(&[("elementwise", &broken)]).unwrap_err();
    assert_eq!(e.to_string(), expected.to_string());
    for entry in [
        "cuModuleLoadData",
        "cuModuleLoadDataEx",
        "cuLibraryLoadData",
    ] {
        assert_eq!(probe().count(entry), 0, "{entry}");
    }
    // Its sm_90 sibling is not picked on sm_80.
    AtlasRegistry::load(0, &[("elementwise", &with_broken_cubin(90))]).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Unknown formats
// ---------------------------------------------------------------------------------------------

#[test]
fn bytes_of_no_known_format_reach_the_driver_only_unsafely() {
    standin::run(unknown_formats_load_only_when_asked_unsafely, &[]);
}

fn unknown_formats_load_only_when_asked_unsafely() {
    let cubin = elementwise_cubin(90);
    for blob in [
        &b"\xff\xfe not a format"[..],
        &cubin[..3],
        b"// no .version\n",
    ] {
        let e = AtlasRegistry::load(0, &[("m", blob)]).unwrap_err();
        assert!(matches!(e, AtlasError::InvalidModule { .. }), "{e}");
        assert!(e.to_string().contains("Atlas takes PTX"), "{e}");
    }
    assert_eq!(probe().count("cuModuleLoadData"), 0);
    // SAFETY: the stand-in loads any bytes; the real driver is never given these.
    let registry =
        unsafe { AtlasRegistry::load_with_unknown_formats(0, &[("m", b"\xff\xfe stand-in")]) }
            .unwrap();
    assert_eq!(registry.module_kind("m"), Some(BlobKind::Binary));
    assert_eq!(probe().count("cuModuleLoadData"), 1);
    // Known formats are still checked there.
    // SAFETY: refused before the driver (a truncated cubin).
    let e = unsafe { AtlasRegistry::load_with_unknown_formats(0, &[("m", &cubin[..100])]) }
        .unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Linear time: inputs built to make the checks quadratic
// ---------------------------------------------------------------------------------------------

/// 1.6 MB of PTX declaring 80,000 kernels: every name is looked up once (the reader compared
/// each with every earlier one, 11.7 s).
#[test]
fn a_ptx_text_of_80_000_kernels_is_read() {
    let mut ptx = b".version 8.0\n.target sm_90\n.address_size 64\n".to_vec();
    for k in 0..80_000 {
        ptx.extend_from_slice(format!(".entry k{k}(.param .u32 n) {{ ret; }}\n").as_bytes());
    }
    assert!(ptx.len() > 1_600_000);
    assert_eq!(validate_blob("many", &ptx).unwrap(), BlobKind::Ptx);
    let layouts = ptx_kernel_layouts(&ptx).unwrap();
    assert_eq!(layouts.len(), 80_000);
    assert_eq!(layouts[79_999].name, "k79999");
    ptx.extend_from_slice(b".entry k7(.param .u32 n) { ret; }\n");
    let e = ptx_kernel_layouts(&ptx).unwrap_err();
    assert!(e.to_string().contains("a second kernel named `k7`"), "{e}");
}

/// The demo's sm_90 elementwise cubin with `count` more relocation sections appended, each
/// holding the same `entries` relocations (R_CUDA_NONE of symbol 0 at offset 0 of `.text.scale`)
/// in one shared region: 2.1 MB for 16,000 sections (2.1 s to check once, each section's
/// entries read again).
fn cubin_with_shared_relocations(count: usize, entries: usize) -> Vec<u8> {
    let cubin = elementwise_cubin(90);
    let u16_at = |at: usize| u16::from_le_bytes([cubin[at], cubin[at + 1]]) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(cubin[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(cubin[at..at + 8].try_into().unwrap()) as usize;
    let (shoff, shnum) = (u64_at(40), u16_at(60));
    let headers = &cubin[shoff..shoff + shnum * 64];
    let find = |kind: u32, name: Option<&str>| {
        (1..shnum)
            .find(|&i| {
                let h = shoff + i * 64;
                let names = shoff + u16_at(62) * 64;
                let name_at = u64_at(names + 24) + u32_at(h) as usize;
                let end = name_at + cubin[name_at..].iter().position(|&c| c == 0).unwrap();
                u32_at(h + 4) == kind && name.is_none_or(|n| &cubin[name_at..end] == n.as_bytes())
            })
            .unwrap()
    };
    let symtab = find(2, None);
    let text = find(1, Some(".text.scale"));
    let mut b = cubin[..shoff].to_vec();
    b.resize(b.len().div_ceil(8) * 8, 0);
    let region = b.len();
    b.resize(region + entries * 24, 0);
    let table = b.len();
    b.extend_from_slice(headers);
    for _ in 0..count {
        let mut h = [0u8; 64];
        h[4..8].copy_from_slice(&4u32.to_le_bytes()); // SHT_RELA
        h[8..16].copy_from_slice(&0x40u64.to_le_bytes()); // SHF_INFO_LINK
        h[24..32].copy_from_slice(&(region as u64).to_le_bytes());
        h[32..40].copy_from_slice(&((entries * 24) as u64).to_le_bytes());
        h[40..44].copy_from_slice(&(symtab as u32).to_le_bytes());
        h[44..48].copy_from_slice(&(text as u32).to_le_bytes());
        h[48..56].copy_from_slice(&8u64.to_le_bytes());
        h[56..64].copy_from_slice(&24u64.to_le_bytes());
        b.extend_from_slice(&h);
    }
    b[40..48].copy_from_slice(&(table as u64).to_le_bytes());
    b[60..62].copy_from_slice(&((shnum + count) as u16).to_le_bytes());
    // No program headers: they were past the section table.
    b[32..40].copy_from_slice(&0u64.to_le_bytes());
    b[56..58].copy_from_slice(&0u16.to_le_bytes());
    b
}

#[test]
fn relocation_sections_sharing_one_region_are_refused() {
    // One such section is a cubin like any other.
    let one = cubin_with_shared_relocations(1, 100);
    assert_eq!(validate_blob("one", &one).unwrap(), BlobKind::Cubin);
    let many = cubin_with_shared_relocations(16_000, 45_000);
    assert!(many.len() > 2_000_000);
    let e = validate_blob("many", &many).unwrap_err().to_string();
    assert!(e.contains("overlap; sections of an ELF file do not"), "{e}");
}

/// A clang offload bundle of `count` entries that all name the same code object.
fn bundle_sharing_one_code_object(count: usize, code: &[u8]) -> Vec<u8> {
    let id = b"hipv4-amdgcn-amd-amdhsa--gfx90a";
    let table = 24 + 8 + count * (24 + id.len());
    let mut b = b"__CLANG_OFFLOAD_BUNDLE__".to_vec();
    b.extend_from_slice(&(count as u64).to_le_bytes());
    for _ in 0..count {
        b.extend_from_slice(&(table as u64).to_le_bytes());
        b.extend_from_slice(&(code.len() as u64).to_le_bytes());
        b.extend_from_slice(&(id.len() as u64).to_le_bytes());
        b.extend_from_slice(id);
    }
    b.extend_from_slice(code);
    b
}

#[test]
fn bundle_entries_sharing_one_code_object_are_refused() {
    let cubin = elementwise_cubin(90);
    let one = bundle_sharing_one_code_object(1, cubin);
    assert_eq!(validate_blob("one", &one).unwrap(), BlobKind::OffloadBundle);
    let many = bundle_sharing_one_code_object(32_000, cubin);
    assert!(many.len() > 1_750_000);
    let e = validate_blob("many", &many).unwrap_err().to_string();
    assert!(
        e.contains("entries 0 and 1 share bytes of their code objects"),
        "{e}"
    );
}
