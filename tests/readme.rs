//! README's code is the repository's: its Rust blocks are the example programs it names, whole
//! (cargo builds and lints those), its `Cargo.toml` lines turn on what they need, its
//! newcomer commands name files that exist, and its links and `docs/`'s stay inside the
//! repository and resolve.

use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The fenced blocks of `text` whose info string is `lang`, in order.
fn blocks<'a>(text: &'a str, lang: &str) -> Vec<&'a str> {
    let open = format!("```{lang}\n");
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(&open) {
        let body = &rest[at + open.len()..];
        let end = body.find("```").expect("a closed block");
        found.push(&body[..end]);
        rest = &body[end..][3..];
    }
    found
}

#[test]
fn the_readmes_rust_blocks_are_its_examples_whole() {
    let readme = read("README.md");
    let rust = blocks(&readme, "rust");
    assert_eq!(
        rust.len(),
        2,
        "README has two Rust blocks: the server, the limiter"
    );
    for (block, example) in rust.iter().zip(["quickstart", "in_process"]) {
        let file = read(&format!("examples/{example}.rs"));
        assert_eq!(
            *block, file,
            "README's block differs from examples/{example}.rs: copy the file into README"
        );
        assert!(
            readme.contains(&format!("](examples/{example}.rs)")),
            "README links examples/{example}.rs"
        );
    }
    // The server fits a newcomer's screen.
    assert!(
        rust[0].lines().count() <= 25,
        "{} lines",
        rust[0].lines().count()
    );
}

#[test]
fn the_readmes_dependencies_turn_on_what_the_server_needs() {
    let readme = read("README.md");
    let toml_block = blocks(&readme, "toml");
    let deps: toml::Table = toml::from_str(toml_block[0]).unwrap();
    let deps = deps["dependencies"].as_table().unwrap();
    let features = |name: &str| -> Vec<String> {
        let feats = deps[name].get("features").and_then(|f| f.as_array());
        (feats.into_iter().flatten())
            .map(|f| f.as_str().unwrap().to_owned())
            .collect()
    };
    // The example's required features are exactly what README asks for.
    let manifest: toml::Table = toml::from_str(&read("Cargo.toml")).unwrap();
    let example = (manifest["example"].as_array().unwrap().iter())
        .find(|e| e["name"].as_str() == Some("quickstart"))
        .expect("an [[example]] quickstart");
    let required: Vec<String> = (example["required-features"].as_array().unwrap().iter())
        .map(|f| f.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(features("tollgate"), required);
    let version = deps["tollgate"]["version"].as_str().unwrap();
    let ours = manifest["package"]["version"].as_str().unwrap();
    assert!(
        ours.starts_with(version),
        "README asks for {version}, the crate is {ours}"
    );
    // `#[tokio::main]` needs `macros` and `rt-multi-thread`; the listener, `net`.
    for needed in ["macros", "rt-multi-thread", "net"] {
        assert!(
            features("tokio").iter().any(|f| f == needed),
            "tokio {needed}"
        );
    }
    assert!(deps.contains_key("axum"));
    let server = blocks(&readme, "rust")[0];
    assert!(server.contains("#[tokio::main]") && server.contains("TcpListener"));
}

#[test]
fn the_newcomer_commands_stay_in_readme() {
    let readme = read("README.md");
    let sh = blocks(&readme, "sh").concat();
    let main_job = "cargo run --release -p tollgate-cli -- replay --algorithm gcra --limit 10 \
                    --window 1s --burst 20 examples/traces/api.csv\n";
    assert!(
        sh.contains(main_job),
        "the main job, as CONTRIBUTING.md lists it"
    );
    assert!(sh.contains("bash scripts/test.sh\n"));
    assert!(Path::new(ROOT).join("examples/traces/api.csv").is_file());
    assert!(Path::new(ROOT).join("scripts/test.sh").is_file());
}

/// Every markdown link of README and `docs/*.md` is relative and names a file of the
/// repository (and of the package: `scripts/package-check.sh` lists the docs).
#[test]
fn readme_and_docs_link_only_files_that_exist() {
    let mut pages = vec!["README.md".to_owned()];
    for entry in std::fs::read_dir(Path::new(ROOT).join("docs")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".md") {
            pages.push(format!("docs/{name}"));
        }
    }
    for page in &pages {
        let text = read(page);
        let dir = Path::new(ROOT).join(page).parent().unwrap().to_owned();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let target = &tail[..tail.find(')').unwrap()];
            rest = tail;
            assert!(!target.contains("://"), "{page} links outside: {target}");
            let file = target.split('#').next().unwrap();
            if file.is_empty() || file.contains("::") {
                continue; // a link within the page, or rustdoc's (docs/ compiled into it)
            }
            assert!(
                dir.join(file).exists(),
                "{page} links {target}, which is not there"
            );
        }
    }
}
