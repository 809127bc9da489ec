//! `cargo run --example show -- TARGET FILE`: prints the operations a fuzz input stands for.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, target, file] = args.as_slice() else {
        eprintln!("usage: show TARGET FILE");
        std::process::exit(2);
    };
    let data = std::fs::read(file).expect("readable input");
    tollgate_fuzz::show(target, &data);
}
