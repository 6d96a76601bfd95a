//! `pipette`: inspect nodes, cluster files and models without launching. See `pipette::app`.

fn main() {
    std::process::exit(pipette::app::pipette_main(std::env::args_os()));
}
