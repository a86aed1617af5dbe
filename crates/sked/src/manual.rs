//! Shell completions and manual pages, generated from the command line's own definition
//! (`cli::Cli`), so they can never disagree with the flags. Packages run these at build time;
//! this module only renders, it decides nothing about the commands.

use crate::cli::Cli;
use anyhow::{Context, Result};
use clap::CommandFactory;
use std::io::Write;
use std::path::Path;

/// `sked completions SHELL`: the shell's completion script for every command and flag.
pub fn completions(shell: clap_complete::Shell, out: &mut impl Write) -> Result<()> {
    let mut command = Cli::command();
    clap_complete::generate(shell, &mut command, "sked", out);
    out.flush().context("cannot write the completion script")
}

/// `sked man --out-dir DIR`: `sked.1` and a page per subcommand (`sked-server.1`,
/// `sked-job-apply.1`, ...), written into `dir`.
pub fn man_pages(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the directory {}", dir.display()))?;
    clap_mangen::generate_to(Cli::command(), dir)
        .with_context(|| format!("cannot write the manual pages into {}", dir.display()))?;
    println!("manual pages written to {}", dir.display());
    Ok(())
}
