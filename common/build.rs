//! `sqlx::migrate!` embeds the migrations at compile time: a migration added or changed must
//! rebuild this crate (cargo does not know the macro read the directory).
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
