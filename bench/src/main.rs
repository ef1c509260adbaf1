//! `attune-bench`: measures throughput and latency through the API of a running attune and prints
//! a table (see docs/benchmarks.md; `make bench` starts a fresh system and runs it).

mod workloads;

use clap::Parser;

#[derive(Parser)]
#[command(name = "attune-bench", version, about = "Measure attune's throughput and latency through its API")]
struct Args {
    /// API base URL
    #[arg(long, env = "ATTUNE_API_URL", default_value = "http://127.0.0.1:8080")]
    api_url: String,
    /// API token (create one with `attune token create`)
    #[arg(long, env = "ATTUNE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    bench: workloads::BenchArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match workloads::run(&args.api_url, args.token, args.bench).await {
        Ok(report) => {
            println!("{}", workloads::table(&report));
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
