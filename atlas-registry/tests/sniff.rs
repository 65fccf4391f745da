//! `atlas_registry::sniff`: what kind a blob is, from its first bytes. No GPU, no driver.
//!
//! The expectations are written by hand, byte string by byte string, from the magic numbers and
//! from what UTF-8 allows (never by a second classifier): a table of concrete blobs, the committed
//! blobs and their prefixes, and properties of arbitrary input whose answer is known without
//! classifying it (a magic decides whatever follows; 0xFF is never UTF-8; text is never binary).
//!
//! `PROPTEST_CASES=N` runs the properties longer; a failure is saved beside this file in
//! `sniff.proptest-regressions` and tried first on later runs.

mod support;

use atlas_kernels::{CUBIN_ARCHS, ELEMENTWISE_FATBIN, MODELS, cubin_for_model, ptx_for_model};
use atlas_registry::{BlobKind, sniff};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

use BlobKind::{Binary, Cubin, Fatbin, OffloadBundle, Ptx};

/// Concrete blobs and their kinds.
const TABLE: &[(&[u8], BlobKind)] = &[
    (b"", Ptx),
    (b"\n", Ptx),
    (b".version 9.0\n.target sm_90\n.address_size 64\n", Ptx),
    (b"// a comment, then nothing\0", Ptx),
    ("// Unicode text: \u{e9}\u{4e2d}\u{1f600}".as_bytes(), Ptx),
    (b"\x7f", Ptx),
    (b"\x7fE", Ptx),
    (b"\x7fEL", Ptx),
    (b"\x7fELF", Cubin),
    (b"\x7fELF\x02\x01\x01\x33", Cubin),
    (b"\x7fELF\xff\xfe\xfd", Cubin),
    (b"\x7felf", Ptx),
    (b" \x7fELF", Ptx),
    (b"\x50", Ptx),
    (b"\x50\xed", Binary),
    (b"\x50\xed\x55", Binary),
    (b"\x50\xed\x55\xba", Fatbin),
    (b"\x50\xed\x55\xba\x01\x00\x10\x00", Fatbin),
    (b"\xba\x55\xed\x50", Binary),
    (b"__CLANG_OFFLOAD_BUNDLE__", OffloadBundle),
    (
        b"__CLANG_OFFLOAD_BUNDLE__\x02\x00\x00\x00\xff",
        OffloadBundle,
    ),
    (b"__CLANG_OFFLOAD_BUNDLE_", Ptx),
    (b"__clang_offload_bundle__", Ptx),
    (b"\xff", Binary),
    (b"\xfe\xff.version", Binary),
    (b".version 9.0\n\xc3", Binary),
    (b".version 9.0\n\xc3\xa9", Ptx),
    (b"\xc0\x80", Binary),
    (b"\xed\xa0\x80", Binary),
    (b"\x00\x00\x00\x00", Ptx),
    (b"\x00\x7fELF", Ptx),
];

#[test]
fn concrete_blobs_are_the_kinds_written_beside_them() {
    let wrong: Vec<String> = TABLE
        .iter()
        .filter(|(blob, kind)| sniff(blob) != *kind)
        .map(|(blob, kind)| format!("{blob:x?}: want {kind:?}, sniff says {:?}", sniff(blob)))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_prefix_of_the_real_blobs_is_classified_without_panic() {
    // PTX is ASCII text: every prefix of it is text.
    for model in MODELS {
        for &(module, ptx) in ptx_for_model(model).unwrap() {
            for len in 0..=ptx.len() {
                assert_eq!(sniff(&ptx[..len]), Ptx, "{model}/{module}.ptx cut at {len}");
            }
        }
    }
    // A cubin starts `\x7f E L F`: shorter prefixes are ASCII text, the rest carry the magic.
    for model in MODELS {
        for &sm in CUBIN_ARCHS {
            for &(module, cubin) in cubin_for_model(model, sm).unwrap() {
                for len in 0..=cubin.len() {
                    let want = if len < 4 { Ptx } else { Cubin };
                    assert_eq!(
                        sniff(&cubin[..len]),
                        want,
                        "{model}/{module}.sm_{sm}.cubin cut at {len}"
                    );
                }
            }
        }
    }
    // The fatbin starts `50 ED 55 BA`: "" and "P" are text, `50 ED` and `50 ED 55` are not UTF-8
    // (0xED needs a continuation byte), four bytes on carry the magic.
    for len in 0..=ELEMENTWISE_FATBIN.len() {
        let want = match len {
            0 | 1 => Ptx,
            2 | 3 => Binary,
            _ => Fatbin,
        };
        assert_eq!(
            sniff(&ELEMENTWISE_FATBIN[..len]),
            want,
            "fatbin cut at {len}"
        );
    }
    assert_eq!(sniff(ELEMENTWISE_FATBIN), BlobKind::Fatbin);
    assert_eq!(
        sniff(cubin_for_model("demo", 90).unwrap()[0].1),
        BlobKind::Cubin
    );
    assert_eq!(sniff(ptx_for_model("demo").unwrap()[0].1), BlobKind::Ptx);
}

/// Headers a blob may start with, each with the kind it must be whatever follows (`None` when
/// what follows decides) and the kind it must be when what follows is [`text_tail`] text.
fn header() -> impl Strategy<Value = (Vec<u8>, Option<BlobKind>, Option<BlobKind>)> {
    prop_oneof![
        Just((b"\x7fELF".to_vec(), Some(Cubin), Some(Cubin))),
        Just((b"\x7fELF\x02\x01\x01".to_vec(), Some(Cubin), Some(Cubin))),
        Just((vec![0x50, 0xED, 0x55, 0xBA], Some(Fatbin), Some(Fatbin))),
        Just((
            vec![0x50, 0xED, 0x55, 0xBA, 0x01, 0x00, 0x10, 0x00],
            Some(Fatbin),
            Some(Fatbin)
        )),
        Just((
            b"__CLANG_OFFLOAD_BUNDLE__".to_vec(),
            Some(OffloadBundle),
            Some(OffloadBundle)
        )),
        Just((vec![0xFF], Some(Binary), Some(Binary))),
        // Truncated magics: what follows may complete them. Text tails cannot (no `F`, no 0xBA).
        Just((b"\x7fEL".to_vec(), None, Some(Ptx))),
        Just((vec![0x50, 0xED, 0x55], None, Some(Binary))),
        Just((b".version 9.0\n.target sm_90\n".to_vec(), None, Some(Ptx))),
        Just((Vec::new(), None, Some(Ptx))),
    ]
}

/// Text that can neither complete a magic nor start one: lowercase ASCII, punctuation, and
/// characters of two, three and four bytes in UTF-8.
fn text_tail() -> impl Strategy<Value = String> {
    "[a-z0-9 .;{}()\n\u{e9}\u{4e2d}\u{1f600}]{0,256}"
}

proptest! {
    // Cases: 256 by default, `PROPTEST_CASES` for more. A failure is saved beside this file, in
    // `sniff.proptest-regressions`, and tried first on later runs.
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    /// Arbitrary bytes: `sniff` never panics and always says the same; behind 0xFF (a byte that
    /// never occurs in UTF-8 and starts no magic) they are binary.
    #[test]
    fn sniff_classifies_arbitrary_bytes(blob in proptest::collection::vec(any::<u8>(), 0..4096)) {
        prop_assert_eq!(sniff(&blob), sniff(&blob));
        let behind_ff = [&[0xFF][..], &blob].concat();
        prop_assert_eq!(sniff(&behind_ff), Binary);
    }

    /// Arbitrary bytes behind an ELF, fatbin or bundle header (or a truncated one): a whole magic
    /// decides, whatever follows; behind a truncated one, text that cannot complete it decides.
    #[test]
    fn sniff_classifies_headers_whatever_follows(
        (head, any_tail, with_text) in header(),
        tail in proptest::collection::vec(any::<u8>(), 0..2048),
        text in text_tail(),
    ) {
        let blob = [&head[..], &tail].concat();
        let kind = sniff(&blob);
        if let Some(want) = any_tail {
            prop_assert_eq!(kind, want);
        }
        let with_text_blob = [&head[..], text.as_bytes()].concat();
        if let Some(want) = with_text {
            prop_assert_eq!(sniff(&with_text_blob), want);
        }
    }

    /// Text is never binary and never a fatbin (whose magic is not UTF-8); text behind a PTX
    /// comment marker, which starts no magic, is PTX.
    #[test]
    fn sniff_calls_text_ptx(text in any::<String>()) {
        let kind = sniff(text.as_bytes());
        prop_assert_ne!(kind, BlobKind::Binary);
        prop_assert_ne!(kind, BlobKind::Fatbin);
        prop_assert_eq!(sniff(format!("// {text}").as_bytes()), Ptx);
    }
}
