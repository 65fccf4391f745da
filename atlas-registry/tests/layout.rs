//! The module structure of `atlas-registry`, measured from its sources: which modules import
//! which, the import circles, and how many dependency floors the modules stand on. A second check
//! keeps the names of raw driver entry points inside `driver/`.
//!
//! `cargo test -p atlas-registry --test layout -- --nocapture` prints the report. No GPU is needed.
//!
//! How it reads the sources (std only, no parser crate):
//! - every `.rs` file under `src/` is a module (`foo.rs` and `foo/mod.rs` are `foo`,
//!   `foo/bar.rs` is `foo::bar`); `lib.rs` only declares and re-exports, so it is not in the
//!   graph; files named `tests.rs` and `#[cfg(test)] mod …` blocks are test code, not structure;
//! - comments, string and char literals and `#[doc …]` attributes are blanked first, so prose and
//!   intra-doc links never count;
//! - each `crate::…`, `super::…` and `self::…` path (in `use` trees, grouped ones included, and
//!   inline) is resolved to the longest prefix that is a module; a path that stops at the crate
//!   root follows the root's re-export (`crate::AtlasError` is `error`); references to the
//!   module itself or to its descendants are not imports.
//!
//! A module's floor is the length, in modules, of the longest import chain that starts at it, with
//! each circle counted as one module: a module that imports nothing from the crate is on floor 1.
//!
//! Two levels are measured. Files: no import circles, no two files importing each other. Concepts
//! (the top-level modules: `driver`, `error`, `device`, `code`, `memory`, `launch`, `registry`,
//! `graph`, each a folder or one file): no circles either, and at most [`MAX_FLOORS`] floors. The
//! files' floors are reported, not bounded: inside a concept, files layer as finely as their jobs
//! do (a typed driver wrapper under the context binding under the stream).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The most floors the crate's concepts (its top-level modules) may stand on.
const MAX_FLOORS: usize = 6;

/// A module path below the crate root; the root itself is the empty path.
type ModPath = Vec<String>;

/// One token of blanked source, with the line it starts on.
#[derive(Debug, Clone, PartialEq)]
struct Tok {
    text: String,
    line: usize,
}

// ---------------------------------------------------------------------------------------------
// Reading sources

/// Blanks comments (line, block, doc), string literals (plain, byte, raw) and char literals with
/// spaces, keeping every newline so that line numbers stay right. Lifetimes are kept.
fn blank_comments_and_literals(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out: Vec<char> = c.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for ch in &mut out[from..to.min(c.len())] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    let ident_char = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            let end = c[i..]
                .iter()
                .position(|&ch| ch == '\n')
                .map_or(c.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if c[i] == '/' && next == Some('*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < c.len() && depth > 0 {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if c[i] == '\'' {
            // 'x' and '\n' are char literals; 'a in `&'a str` is a lifetime.
            let end = if next == Some('\\') {
                (i + 2..c.len()).find(|&j| c[j] == '\'').map(|j| j + 1)
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 3)
            } else {
                None
            };
            match end {
                Some(end) => {
                    blank(&mut out, i, end);
                    i = end;
                }
                None => i += 1,
            }
        } else if ident_char(c[i]) {
            // A whole identifier; `r`, `br` and `cr` just before `"` or `#"` open a raw string.
            let start = i;
            while i < c.len() && ident_char(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let hashes = c[i..].iter().take_while(|&&ch| ch == '#').count();
            if matches!(word.as_str(), "r" | "br" | "cr") && c.get(i + hashes) == Some(&'"') {
                let closing: Vec<char> = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                let body = i + hashes + 1;
                let end = (body..c.len())
                    .find(|&j| c[j..].starts_with(&closing))
                    .map_or(c.len(), |j| j + closing.len());
                blank(&mut out, i, end);
                i = end;
            }
        } else {
            i += 1;
        }
    }
    out.into_iter().collect()
}

/// Splits blanked source into identifiers (`$crate` and other `$name`s included), numbers, `::`
/// and single punctuation characters.
fn tokenize(code: &str) -> Vec<Tok> {
    let c: Vec<char> = code.chars().collect();
    let ident_char = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut toks = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let start = i;
        if c[i] == '\n' {
            line += 1;
            i += 1;
            continue;
        } else if c[i].is_whitespace() {
            i += 1;
            continue;
        } else if ident_char(c[i]) || (c[i] == '$' && c.get(i + 1).is_some_and(|&n| ident_char(n)))
        {
            i += 1;
            while i < c.len() && ident_char(c[i]) {
                i += 1;
            }
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            i += 2;
        } else {
            i += 1;
        }
        let text: String = c[start..i].iter().collect();
        let text = if text == "$crate" {
            "crate".to_owned()
        } else {
            text
        };
        toks.push(Tok { text, line });
    }
    toks
}

/// The index just past the bracket that closes the one at `open` (`(`, `[` or `{`).
fn past_closing(toks: &[Tok], open: usize) -> usize {
    let (o, cl) = match toks[open].text.as_str() {
        "(" => ("(", ")"),
        "[" => ("[", "]"),
        _ => ("{", "}"),
    };
    let mut depth = 0;
    for (j, t) in toks.iter().enumerate().skip(open) {
        if t.text == o {
            depth += 1;
        } else if t.text == cl {
            depth -= 1;
            if depth == 0 {
                return j + 1;
            }
        }
    }
    toks.len()
}

fn is(toks: &[Tok], i: usize, text: &str) -> bool {
    toks.get(i).is_some_and(|t| t.text == text)
}

fn is_ident(toks: &[Tok], i: usize) -> bool {
    toks.get(i)
        .and_then(|t| t.text.chars().next())
        .is_some_and(|ch| ch.is_alphabetic() || ch == '_')
}

/// Drops `#[cfg(test)] mod …` items (inline or not) and `#[doc …]` / `#![doc …]` attributes.
fn drop_test_modules_and_doc_attributes(toks: Vec<Tok>) -> Vec<Tok> {
    let mut kept = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        let bang = usize::from(is(&toks, i + 1, "!"));
        if is(&toks, i, "#") && is(&toks, i + 1 + bang, "[") && is(&toks, i + 2 + bang, "doc") {
            i = past_closing(&toks, i + 1 + bang);
            continue;
        }
        let cfg_test = ["#", "[", "cfg", "(", "test", ")", "]"];
        if cfg_test
            .iter()
            .enumerate()
            .all(|(k, want)| is(&toks, i + k, want))
        {
            let mut j = i + cfg_test.len();
            while is(&toks, j, "#") && is(&toks, j + 1, "[") {
                j = past_closing(&toks, j + 1);
            }
            if is(&toks, j, "pub") {
                j += if is(&toks, j + 1, "(") {
                    past_closing(&toks, j + 1) - j
                } else {
                    1
                };
            }
            if is(&toks, j, "mod") && is_ident(&toks, j + 1) {
                i = if is(&toks, j + 2, "{") {
                    past_closing(&toks, j + 2)
                } else {
                    j + 3
                };
                continue;
            }
        }
        kept.push(toks[i].clone());
        i += 1;
    }
    kept
}

/// The tokens of a source file that are code: no comments, literals, doc attributes or test
/// modules.
fn code_tokens(src: &str) -> Vec<Tok> {
    drop_test_modules_and_doc_attributes(tokenize(&blank_comments_and_literals(src)))
}

/// The module a file under `src/` holds (`None` for `tests.rs` files and anything not Rust).
fn module_of(rel: &Path) -> Option<ModPath> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop()?;
    let stem = file.strip_suffix(".rs")?;
    match stem {
        "tests" => None,
        "lib" if parts.is_empty() => Some(Vec::new()),
        "mod" => Some(parts),
        _ => {
            parts.push(stem.to_owned());
            Some(parts)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Paths a file mentions

/// One path a file mentions, as written: `crate::a::X`, `super::b`, `c::d` (bare, from a `use`).
/// `name` is what a `use` binds it to (`None` for globs and inline paths).
#[derive(Debug, Clone, PartialEq)]
struct Mention {
    path: Vec<String>,
    name: Option<String>,
}

/// Reads one use tree at `*i`, pushing a mention for each leaf.
fn read_use_tree(toks: &[Tok], i: &mut usize, prefix: &[String], out: &mut Vec<Mention>) {
    if is(toks, *i, "{") {
        *i += 1;
        while *i < toks.len() && !is(toks, *i, "}") {
            let before = *i;
            read_use_tree(toks, i, prefix, out);
            if is(toks, *i, ",") || *i == before {
                *i += 1;
            }
        }
        *i += 1;
    } else if is(toks, *i, "*") {
        *i += 1;
        out.push(Mention {
            path: prefix.to_vec(),
            name: None,
        });
    } else if is(toks, *i, "::") && prefix.is_empty() {
        // `use ::name::…` names an external crate.
        *i += 1;
        read_use_tree(toks, i, &["::".to_owned()], out);
    } else if is_ident(toks, *i) {
        let segment = toks[*i].text.clone();
        *i += 1;
        let mut path = prefix.to_vec();
        if is(toks, *i, "::") {
            *i += 1;
            path.push(segment);
            read_use_tree(toks, i, &path, out);
            return;
        }
        if segment != "self" {
            path.push(segment);
        }
        let mut name = path.last().cloned();
        if is(toks, *i, "as") {
            name = toks.get(*i + 1).map(|t| t.text.clone());
            *i += 2;
        }
        out.push(Mention { path, name });
    }
}

/// Every path a file mentions that may name a module of the crate: each leaf of each `use` tree,
/// and each inline path starting `crate::`, `super::` or `self::`. Visibility paths
/// (`pub(in crate::a)`) are not mentions.
fn mentions(toks: &[Tok]) -> Vec<Mention> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if is(toks, i, "use") && !is(toks, i + 1, "<") && (i == 0 || !is(toks, i - 1, "::")) {
            i += 1;
            read_use_tree(toks, &mut i, &[], &mut out);
        } else if is(toks, i, "pub") && is(toks, i + 1, "(") {
            i = past_closing(toks, i + 1);
        } else if ["crate", "super", "self"].iter().any(|s| is(toks, i, s))
            && is(toks, i + 1, "::")
            && (i == 0 || !is(toks, i - 1, "::"))
        {
            let mut path = vec![toks[i].text.clone()];
            i += 1;
            while is(toks, i, "::") && is_ident(toks, i + 1) {
                path.push(toks[i + 1].text.clone());
                i += 2;
            }
            out.push(Mention { path, name: None });
        } else {
            i += 1;
        }
    }
    out
}

/// A mentioned path made absolute (from the crate root), as seen from module `here`. A bare path
/// is relative to `here`; `None` for external crates and `super` above the root.
fn absolute(path: &[String], here: &[String]) -> Option<ModPath> {
    let first = path.first()?;
    let mut abs: ModPath = match first.as_str() {
        "::" => return None,
        "crate" => Vec::new(),
        "self" => here.to_vec(),
        "super" => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            let keep = here.len().checked_sub(ups)?;
            let mut abs = here[..keep].to_vec();
            abs.extend(path[ups..].iter().cloned());
            return Some(abs);
        }
        _ => {
            let mut abs = here.to_vec();
            abs.push(first.clone());
            abs
        }
    };
    abs.extend(path[1..].iter().cloned());
    Some(abs)
}

/// The longest prefix of `abs` that is a module (the root when none is).
fn resolve(abs: &[String], modules: &BTreeSet<ModPath>) -> ModPath {
    (0..=abs.len())
        .rev()
        .map(|n| abs[..n].to_vec())
        .find(|p| modules.contains(p))
        .unwrap_or_default()
}

/// What the crate root re-exports: bound name → the module the item comes from.
fn root_reexports(root_toks: &[Tok], modules: &BTreeSet<ModPath>) -> BTreeMap<String, ModPath> {
    mentions(root_toks)
        .into_iter()
        .filter_map(|m| {
            let module = resolve(&absolute(&m.path, &[])?, modules);
            Some((m.name?, module)).filter(|(_, module)| !module.is_empty())
        })
        .collect()
}

/// The crate modules that module `here` imports: every mention resolved, minus the root, `here`
/// itself and its descendants.
fn imports(
    here: &[String],
    toks: &[Tok],
    modules: &BTreeSet<ModPath>,
    reexports: &BTreeMap<String, ModPath>,
) -> BTreeSet<ModPath> {
    mentions(toks)
        .iter()
        .filter_map(|m| {
            let abs = absolute(&m.path, here)?;
            let target = resolve(&abs, modules);
            let target = if target.is_empty() {
                reexports.get(abs.first()?)?.clone()
            } else {
                target
            };
            Some(target).filter(|t| !t.starts_with(here))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The graph

/// Strongly connected components (Tarjan), each as sorted node indexes, in no particular order.
fn components(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in s.edges[v].iter() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            comp.sort_unstable();
            s.out.push(comp);
        }
    }
    let n = edges.len();
    let mut s = State {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

/// Circles: the components of more than one node, sorted.
fn circles(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    let mut c: Vec<_> = components(edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    c.sort();
    c
}

/// Each node's floor: 1 + the highest floor it imports from, each circle counted as one node.
fn floors(edges: &[BTreeSet<usize>]) -> Vec<usize> {
    let comps = components(edges);
    let mut comp_of = vec![0; edges.len()];
    for (k, comp) in comps.iter().enumerate() {
        for &v in comp {
            comp_of[v] = k;
        }
    }
    // Tarjan emits a component only after every component it reaches: one pass in order suffices.
    let mut comp_floor = vec![0; comps.len()];
    for (k, comp) in comps.iter().enumerate() {
        let below = comp
            .iter()
            .flat_map(|&v| edges[v].iter())
            .map(|&w| comp_of[w])
            .filter(|&cw| cw != k)
            .map(|cw| comp_floor[cw])
            .max()
            .unwrap_or(0);
        comp_floor[k] = below + 1;
    }
    (0..edges.len()).map(|v| comp_floor[comp_of[v]]).collect()
}

/// Pairs of nodes that import each other directly, `(a, b)` with `a < b`.
fn mutual_imports(edges: &[BTreeSet<usize>]) -> Vec<(usize, usize)> {
    (0..edges.len())
        .flat_map(|a| {
            edges[a]
                .iter()
                .filter(move |&&b| a < b && edges[b].contains(&a))
                .map(move |&b| (a, b))
        })
        .collect()
}

/// A longest import chain, from the top floor down to floor 1, one step per floor: each step is a
/// module, or the members of a circle.
fn longest_chain(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    let floor = floors(edges);
    let comps = components(edges);
    let comp_of = |v: usize| {
        comps
            .iter()
            .find(|c| c.contains(&v))
            .cloned()
            .unwrap_or_default()
    };
    let Some(mut v) = (0..edges.len()).min_by_key(|&v| (std::cmp::Reverse(floor[v]), v)) else {
        return Vec::new();
    };
    let mut chain = vec![comp_of(v)];
    while floor[v] > 1 {
        let here = comp_of(v);
        let below = here
            .iter()
            .flat_map(|&u| edges[u].iter())
            .copied()
            .filter(|&w| floor[w] + 1 == floor[v])
            .min();
        let Some(w) = below else { break };
        chain.push(comp_of(w));
        v = w;
    }
    chain
}

// ---------------------------------------------------------------------------------------------
// Raw driver names

/// Where code names a raw driver entry point: `entry!` uses and `cuXxx` identifiers (a CUDA
/// driver function name: `cu` then an upper-case letter). Returns (line, name) pairs.
fn raw_driver_names(toks: &[Tok]) -> Vec<(usize, String)> {
    toks.iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let mut ch = t.text.chars();
            let cu_name = ch.next() == Some('c')
                && ch.next() == Some('u')
                && ch.next().is_some_and(|c| c.is_ascii_uppercase());
            if cu_name {
                Some((t.line, t.text.clone()))
            } else if t.text == "entry" && is(toks, i + 1, "!") {
                Some((t.line, "entry!".to_owned()))
            } else {
                None
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The crate

struct SourceFile {
    rel: PathBuf,
    module: ModPath,
    toks: Vec<Tok>,
}

/// `atlas-registry/src`: where the crate was built from, or, for a test binary run elsewhere (a
/// copy of the repository on another machine), below the working directory.
fn src_dir() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    if built.is_dir() {
        return built;
    }
    Path::new("atlas-registry/src").to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
                .path()
        })
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// Every module file under `src/`, read and tokenized (the root included, test files not).
fn source_files() -> Vec<SourceFile> {
    let src = src_dir();
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    paths
        .into_iter()
        .filter_map(|path| {
            let rel = path.strip_prefix(&src).unwrap_or(&path).to_path_buf();
            let module = module_of(&rel)?;
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            Some(SourceFile {
                rel,
                module,
                toks: code_tokens(&text),
            })
        })
        .collect()
}

fn display(m: &[String]) -> String {
    if m.is_empty() {
        "crate".to_owned()
    } else {
        m.join("::")
    }
}

#[test]
fn module_structure_has_no_circles_and_few_floors() {
    let files = source_files();
    let all: BTreeSet<ModPath> = files.iter().map(|f| f.module.clone()).collect();
    let root = files
        .iter()
        .find(|f| f.module.is_empty())
        .expect("src/lib.rs is missing");
    let reexports = root_reexports(&root.toks, &all);
    // Sorted by module path, so that every list below comes out in name order.
    let mut nodes: Vec<&SourceFile> = files.iter().filter(|f| !f.module.is_empty()).collect();
    nodes.sort_by(|a, b| a.module.cmp(&b.module));
    let index: BTreeMap<&ModPath, usize> = nodes
        .iter()
        .enumerate()
        .map(|(k, f)| (&f.module, k))
        .collect();
    let edges: Vec<BTreeSet<usize>> = nodes
        .iter()
        .map(|f| {
            imports(&f.module, &f.toks, &all, &reexports)
                .iter()
                .filter_map(|m| index.get(m).copied())
                .collect()
        })
        .collect();
    let floor = floors(&edges);
    let circles = circles(&edges);
    let mutual = mutual_imports(&edges);
    let top = floor.iter().copied().max().unwrap_or(0);
    let name = |v: usize| display(&nodes[v].module);
    let in_circle = |v: usize| circles.iter().any(|c| c.contains(&v));

    let mut report = String::new();
    let _ = writeln!(
        report,
        "atlas-registry/src: {} modules, {} floors, {} import circles\n",
        nodes.len(),
        top,
        circles.len()
    );
    let width = nodes
        .iter()
        .map(|f| display(&f.module).len())
        .max()
        .unwrap_or(0)
        .max(6);
    let _ = writeln!(report, "floor  {:width$}  imports from the crate", "module");
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by_key(|&v| (std::cmp::Reverse(floor[v]), name(v)));
    for v in order {
        let imported: Vec<String> = edges[v].iter().map(|&w| name(w)).collect();
        let imported = if imported.is_empty() {
            "-".to_owned()
        } else {
            imported.join(", ")
        };
        let mark = if in_circle(v) { '*' } else { ' ' };
        let _ = writeln!(
            report,
            "{:>5}{mark} {:width$}  {imported}",
            floor[v],
            name(v)
        );
    }
    if circles.is_empty() {
        let _ = writeln!(report, "\nimport circles: none");
    } else {
        let _ = writeln!(
            report,
            "\nimport circles (* above; a circle counts as one floor):"
        );
        for (k, c) in circles.iter().enumerate() {
            let members: Vec<String> = c.iter().map(|&v| name(v)).collect();
            let _ = writeln!(report, "  {}. {}", k + 1, members.join(", "));
            for &v in c {
                let inner: Vec<String> = edges[v]
                    .iter()
                    .filter(|w| c.contains(w))
                    .map(|&w| name(w))
                    .collect();
                let _ = writeln!(report, "       {} -> {}", name(v), inner.join(", "));
            }
        }
    }
    if !mutual.is_empty() {
        let pairs: Vec<String> = mutual
            .iter()
            .map(|&(a, b)| format!("{} <-> {}", name(a), name(b)))
            .collect();
        let _ = writeln!(
            report,
            "modules that import each other: {}",
            pairs.join(", ")
        );
    }
    let chain: Vec<String> = longest_chain(&edges)
        .iter()
        .map(|step| match step.as_slice() {
            [v] => name(*v),
            members => format!(
                "{{{}}}",
                members
                    .iter()
                    .map(|&v| name(v))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
        .collect();
    let _ = writeln!(
        report,
        "longest chain of files ({top} floors): {}",
        chain.join(" -> ")
    );

    // The concepts: the top-level modules (a folder and everything in it, or one file), with an
    // edge where any file of one imports from a file of the other.
    let concept_names: Vec<String> = nodes
        .iter()
        .map(|f| f.module[0].clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let concept_of = |v: usize| {
        concept_names
            .iter()
            .position(|c| *c == nodes[v].module[0])
            .unwrap_or(0)
    };
    let mut concept_edges = vec![BTreeSet::new(); concept_names.len()];
    for (v, out) in edges.iter().enumerate() {
        for &w in out {
            if concept_of(v) != concept_of(w) {
                concept_edges[concept_of(v)].insert(concept_of(w));
            }
        }
    }
    let concept_floor = floors(&concept_edges);
    let concept_circles = self::circles(&concept_edges);
    let concept_top = concept_floor.iter().copied().max().unwrap_or(0);
    let _ = writeln!(
        report,
        "\nconcepts (top-level modules): {} floors (at most {MAX_FLOORS}), {} import circles",
        concept_top,
        concept_circles.len()
    );
    let mut by_floor: Vec<usize> = (0..concept_names.len()).collect();
    by_floor.sort_by_key(|&c| {
        (
            std::cmp::Reverse(concept_floor[c]),
            concept_names[c].clone(),
        )
    });
    for c in by_floor {
        let imported: Vec<&str> = concept_edges[c]
            .iter()
            .map(|&d| concept_names[d].as_str())
            .collect();
        let _ = writeln!(
            report,
            "{:>5}  {:10}  {}",
            concept_floor[c],
            concept_names[c],
            if imported.is_empty() {
                "-".to_owned()
            } else {
                imported.join(", ")
            }
        );
    }
    println!("{report}");

    let mut wrong = Vec::new();
    if !circles.is_empty() {
        wrong.push(format!(
            "{} import circles of files (want none)",
            circles.len()
        ));
    }
    if !concept_circles.is_empty() {
        wrong.push(format!(
            "{} import circles of concepts (want none)",
            concept_circles.len()
        ));
    }
    if concept_top > MAX_FLOORS {
        wrong.push(format!(
            "{concept_top} floors of concepts (want at most {MAX_FLOORS})"
        ));
    }
    if !mutual.is_empty() {
        wrong.push(format!(
            "{} pairs of modules import each other (want none)",
            mutual.len()
        ));
    }
    assert!(
        wrong.is_empty(),
        "module structure: {} (the report above says where)",
        wrong.join("; ")
    );
}

#[test]
fn only_the_driver_module_names_raw_driver_entry_points() {
    let driver_folder = src_dir().join("driver").is_dir();
    let mut found = Vec::new();
    for f in source_files() {
        if driver_folder && f.module.first().is_some_and(|m| m == "driver") {
            continue;
        }
        let mut by_line: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for (line, name) in raw_driver_names(&f.toks) {
            by_line.entry(line).or_default().push(name);
        }
        for (line, names) in by_line {
            found.push(format!(
                "  src/{}:{line}: {}",
                f.rel.display(),
                names.join(", ")
            ));
        }
    }
    let outside = if driver_folder {
        "outside src/driver/"
    } else {
        "(src/driver/ does not exist yet)"
    };
    let report = format!(
        "raw driver entry points named {outside}: {}\n{}",
        found.len(),
        found.join("\n")
    );
    println!("{report}");
    assert!(
        found.is_empty(),
        "{} raw driver names outside the driver module (listed above)",
        found.len()
    );
}

// ---------------------------------------------------------------------------------------------
// The checker checked, on made-up inputs

fn mods(list: &[&str]) -> BTreeSet<ModPath> {
    list.iter()
        .map(|m| m.split("::").map(str::to_owned).collect())
        .collect()
}

fn path(m: &str) -> ModPath {
    m.split("::").map(str::to_owned).collect()
}

fn imports_of(here: &str, src: &str, modules: &[&str]) -> Vec<String> {
    let all = mods(modules);
    let reexports = BTreeMap::from([("Exported".to_owned(), path("a"))]);
    imports(&path(here), &code_tokens(src), &all, &reexports)
        .iter()
        .map(|m| display(m))
        .collect()
}

fn graph(n: usize, list: &[(usize, usize)]) -> Vec<BTreeSet<usize>> {
    let mut edges = vec![BTreeSet::new(); n];
    for &(a, b) in list {
        edges[a].insert(b);
    }
    edges
}

#[test]
fn files_map_to_modules() {
    assert_eq!(module_of(Path::new("lib.rs")), Some(vec![]));
    assert_eq!(module_of(Path::new("foo.rs")), Some(path("foo")));
    assert_eq!(module_of(Path::new("foo/mod.rs")), Some(path("foo")));
    assert_eq!(module_of(Path::new("foo/bar.rs")), Some(path("foo::bar")));
    assert_eq!(module_of(Path::new("foo/tests.rs")), None);
    assert_eq!(module_of(Path::new("foo/make.py")), None);
}

#[test]
fn grouped_use_trees_name_each_leaf() {
    let src = "use crate::{a::X, b::{c::Y, self, d as e}, f::*};";
    assert_eq!(
        imports_of("z", src, &["a", "b", "b::c", "f", "z"]),
        ["a", "b", "b::c", "f"]
    );
}

#[test]
fn comments_strings_and_doc_attributes_make_no_imports() {
    let src = r##"
        //! See [`crate::a`].
        /// Calls [`crate::b::f`](crate::b::f).
        // crate::c
        /* crate::d /* nested crate::d */ */
        #[doc = "crate::e"]
        #[doc(alias = "crate::e")]
        fn f<'a>(x: &'a str) -> char {
            let _ = ("crate::a", r#"crate::b "quoted""#, b"crate::c", br"crate::c");
            '"'
        }
        fn g() -> char { '\'' }
        fn h() { crate::f::go(); }
    "##;
    assert_eq!(
        imports_of("z", src, &["a", "b", "c", "d", "e", "f", "z"]),
        ["f"]
    );
}

#[test]
fn paths_resolve_to_the_longest_module_prefix() {
    let modules = ["a", "a::b", "c", "z", "z::y"];
    assert_eq!(
        imports_of(
            "z",
            "fn f() { crate::a::b::Thing::new(); crate::a::g(); }",
            &modules
        ),
        ["a", "a::b"]
    );
    // super and self are relative to the file's module; an item of the parent is an import, a
    // module's own descendants are not.
    assert_eq!(
        imports_of("z::y", "use super::super::c::X; use super::Y;", &modules),
        ["c", "z"]
    );
    assert_eq!(
        imports_of(
            "z",
            "use self::y::X; use y::Z; fn f() { crate::z::g() }",
            &modules
        ),
        Vec::<String>::new()
    );
    // A path that stops at the root follows the root's re-export; other root items are nothing.
    assert_eq!(
        imports_of("c", "use crate::Exported; use crate::Other;", &modules),
        ["a"]
    );
    // `$crate` in macros is the crate; visibility paths and external crates are not imports.
    let src = "macro_rules! m { () => { $crate::a::f() } }
        pub(in crate::c) fn g() {}
        use ::std::a;
        use std::c;";
    assert_eq!(imports_of("z", src, &modules), ["a"]);
}

#[test]
fn test_modules_are_skipped() {
    let src = "use crate::a::X;
        #[cfg(test)]
        mod tests { use crate::b::Y; fn t() { crate::c::f() } }
        #[cfg(test)] #[path = \"more.rs\"] mod more;";
    assert_eq!(imports_of("z", src, &["a", "b", "c", "z"]), ["a"]);
}

#[test]
fn the_root_reexports_map_names_to_modules() {
    let all = mods(&["a", "b", "b::c"]);
    let root = code_tokens(
        "mod a; mod b; pub use a::{One, Two as Deux}; pub use b::c::Three; pub use std as sys;",
    );
    let r = root_reexports(&root, &all);
    let got: Vec<(String, String)> = r.iter().map(|(k, v)| (k.clone(), display(v))).collect();
    let want =
        [("Deux", "a"), ("One", "a"), ("Three", "b::c")].map(|(k, v)| (k.to_owned(), v.to_owned()));
    assert_eq!(got, want);
}

#[test]
fn a_two_cycle_is_a_circle_and_a_mutual_import() {
    // 0 <-> 1, 1 -> 2
    let e = graph(3, &[(0, 1), (1, 0), (1, 2)]);
    assert_eq!(circles(&e), [vec![0, 1]]);
    assert_eq!(mutual_imports(&e), [(0, 1)]);
    assert_eq!(floors(&e), [2, 2, 1]);
    assert_eq!(longest_chain(&e), [vec![0, 1], vec![2]]);
}

#[test]
fn a_three_cycle_is_a_circle_but_no_mutual_import() {
    let e = graph(3, &[(0, 1), (1, 2), (2, 0)]);
    assert_eq!(circles(&e), [vec![0, 1, 2]]);
    assert!(mutual_imports(&e).is_empty());
    assert_eq!(floors(&e), [1, 1, 1]);
}

#[test]
fn a_chain_of_three_stands_on_three_floors() {
    // 0 -> 1 -> 2, and a shortcut 0 -> 2 that does not shorten the chain; 3 stands alone.
    let e = graph(4, &[(0, 1), (1, 2), (0, 2)]);
    assert!(circles(&e).is_empty());
    assert_eq!(floors(&e), [3, 2, 1, 1]);
    assert_eq!(longest_chain(&e), [vec![0], vec![1], vec![2]]);
}

#[test]
fn raw_driver_names_are_found_in_code_only() {
    let src = r#"
        //! Wraps cuLaunchKernel.
        #[doc(alias = "cuStreamCreate")]
        fn f(d: &Driver) -> CUresult {
            let s = "cuInit";
            let cuda = cu_init(d.cuda);
            (d.cuLaunchKernel)();
            let p = atlas_sys::entry!(cuda, cuModuleLoadData);
            cuCtxSynchronize()
        }
    "#;
    let got = raw_driver_names(&code_tokens(src));
    let want = [
        (7, "cuLaunchKernel"),
        (8, "entry!"),
        (8, "cuModuleLoadData"),
        (9, "cuCtxSynchronize"),
    ];
    assert_eq!(got, want.map(|(l, n)| (l, n.to_owned())));
}
