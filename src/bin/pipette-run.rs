//! `pipette-run`: torchrun's command line, planned. See `pipette::app`.

fn main() {
    std::process::exit(pipette::app::pipette_run_main(std::env::args_os()));
}
