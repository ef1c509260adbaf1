//! `attune-bench`: measures throughput and latency through the API of a running attune and prints
//! a table (see docs/benchmarks.md; `make bench` starts a fresh system and runs it). The
//! `history` workload measures with and without days of loaded history (`history`), and
//! `--soak MINUTES` whether a long run stays flat (`soak`).

mod events;
mod history;
mod soak;
mod workflows;
mod workloads;

#[derive(clap::Parser)]
#[command(name = "attune-bench", version, about = "Measure attune's throughput and latency through its API")]
struct Args {
    /// API base URL
    #[arg(long, env = "ATTUNE_API_URL")]
    api_url: Option<String>,
    /// API token (create one with `attune token create`)
    #[arg(long, env = "ATTUNE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    bench: workloads::BenchArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Args = attune_common::settings::parse_with_settings_help(attune_common::settings::Process::Bench);
    if args.bench.replot.is_some() {
        return match workloads::replot(&args.bench) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let api_url = match args.api_url.map_or_else(|| attune_common::settings::get("ATTUNE_API_URL"), Ok) {
        Ok(url) => url,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match workloads::run(&api_url, args.token, args.bench).await {
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
