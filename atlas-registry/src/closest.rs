//! The names a lookup could have meant: those that exist, the closest to what was asked first, for
//! [`AtlasError::NotFound`](crate::AtlasError::NotFound).
//!
//! Closeness is the edit distance (insertions, deletions, substitutions; case ignored; of the
//! first [`COMPARED`] characters) between the name asked for and each candidate, or the candidate's plain name where it is a mangled C++
//! name (`scale` of `_Z5scalePfj`), whichever is closer: one asks for `scal` and means
//! `_Z5scalePfj`, or for `scale` and means `scale_f32`. Names equally close come in name order.

/// How many names a refusal lists at most.
pub(crate) const LISTED: usize = 10;

/// How many characters of each name the distance compares: the cost is the product of the two
/// lengths for every candidate, which a long name (any length reaches a lookup) and a module of
/// thousands of kernels would make seconds; a typo is seen well within this many.
const COMPARED: usize = 64;

/// `candidates` ordered closest to `asked` first, at most [`LISTED`] of them.
pub(crate) fn closest<I>(asked: &str, candidates: I) -> Box<[String]>
where
    I: IntoIterator<Item = String>,
{
    let asked = asked.to_lowercase();
    let mut ranked: Vec<(usize, String)> = candidates
        .into_iter()
        .map(|name| {
            let whole = distance(&asked, &name.to_lowercase());
            let plain =
                plain_name(&name).map_or(whole, |plain| distance(&asked, &plain.to_lowercase()));
            (whole.min(plain), name)
        })
        .collect();
    ranked.sort_unstable();
    ranked.dedup_by(|a, b| a.1 == b.1);
    ranked
        .into_iter()
        .take(LISTED)
        .map(|(_, name)| name)
        .collect()
}

/// The function's own name in an Itanium-mangled C++ name: `scale` of `_Z5scalePfj`, `kernel` of
/// `_ZN2ns6kernelEv` (the last name of a nested one); `None` for any other name.
fn plain_name(mangled: &str) -> Option<&str> {
    let mut rest = mangled.strip_prefix("_Z")?;
    let nested = rest.starts_with('N');
    if nested {
        rest = rest[1..].trim_start_matches(['r', 'V', 'K']);
    }
    let mut last = None;
    loop {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return last;
        }
        let len: usize = rest[..digits].parse().ok()?;
        let name = rest.get(digits..digits + len)?;
        rest = &rest[digits + len..];
        last = Some(name);
        if !nested {
            return last;
        }
    }
}

/// The Levenshtein distance between the first [`COMPARED`] characters of `a` and of `b`.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().take(COMPARED).collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().take(COMPARED).enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_closest_name_comes_first_and_mangled_names_match_by_their_plain_name() {
        let kernels = names(&["add", "_Z5scalePfj", "scale_add", "reduce_sum", "Scal"]);
        assert_eq!(
            &*closest("scal", kernels.clone()),
            ["Scal", "_Z5scalePfj", "add", "scale_add", "reduce_sum"]
        );
        assert_eq!(closest("reduce", kernels)[0], "reduce_sum");
    }

    #[test]
    fn at_most_ten_are_listed() {
        let many: Vec<String> = (0..25).map(|i| format!("k{i}")).collect();
        let listed = closest("k7", many);
        assert_eq!(listed.len(), LISTED);
        assert_eq!(listed[0], "k7");
    }

    #[test]
    fn plain_names_of_mangled_kernels() {
        assert_eq!(plain_name("_Z5scalePfj"), Some("scale"));
        assert_eq!(plain_name("_ZN2ns6kernelEv"), Some("kernel"));
        assert_eq!(plain_name("_ZN2ns3abc4deepIfEEvPT_"), Some("deep"));
        assert_eq!(plain_name("scale"), None);
        assert_eq!(plain_name("_Z99x"), None);
    }

    #[test]
    fn long_names_are_compared_by_their_first_characters() {
        let (a, b) = ("x".repeat(10_000), "y".repeat(10_000));
        assert_eq!(distance(&a, &b), COMPARED);
        let same_start = format!("{}{}", "k".repeat(COMPARED), "z".repeat(10_000));
        assert_eq!(distance(&same_start, &"k".repeat(COMPARED)), 0);
    }

    #[test]
    fn distances() {
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("scale", "scale"), 0);
        assert_eq!(distance("é", "e"), 1);
    }
}
