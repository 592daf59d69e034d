//! `veilfs generate` (hidden): man pages and shell completions from the clap definition,
//! so they never drift from `--help`. `scripts/install.sh` and packagers call it.

use crate::exit;
use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Arguments of `veilfs generate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand, Debug)]
enum What {
    /// Write veilfs.1 and one page per subcommand (veilfs-mount.1, …) into DIR.
    Man {
        /// Output directory (created if missing).
        dir: PathBuf,
    },
    /// Print the completion script for SHELL (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Runs `veilfs generate`.
pub fn run(a: Args, cmd: clap::Command) -> Result<i32> {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    match a.what {
        What::Man { dir } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            write_page(&cmd, &dir, true)?;
            for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
                write_page(sub, &dir, false)?;
            }
        }
        What::Completions { shell } => {
            let mut out = std::io::stdout().lock();
            clap_complete::generate(shell, &mut cmd, "veilfs", &mut out);
            out.flush()?;
        }
    }
    Ok(exit::OK)
}

/// Text for a roff body line: backslashes, leading dots/quotes and hyphens escaped.
fn roff_text(s: &str) -> String {
    let s = s.replace('\\', "\\e").replace('-', "\\-");
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
}

/// One page: clap_mangen's title, name, synopsis, description, options and subcommands,
/// then the command's own notes (its after-help), the exit codes and, on veilfs(1), the
/// environment. The top-level after-help *is* the exit-code table, so it is not repeated.
fn write_page(cmd: &clap::Command, dir: &Path, top: bool) -> Result<()> {
    // clap_mangen's DESCRIPTION shows the long about; a subcommand has only its one line.
    let cmd = match (cmd.get_long_about(), cmd.get_about()) {
        (None, Some(about)) => cmd.clone().long_about(about.clone()),
        _ => cmd.clone(),
    };
    let cmd = &cmd;
    let man = clap_mangen::Man::new(cmd.clone())
        .manual("veilfs manual")
        .source(format!("veilfs {}", env!("CARGO_PKG_VERSION")));
    let path = dir.join(man.get_filename());
    let mut w =
        std::io::BufWriter::new(std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?);
    man.render_title(&mut w)?;
    man.render_name_section(&mut w)?;
    man.render_synopsis_section(&mut w)?;
    man.render_description_section(&mut w)?;
    man.render_options_section(&mut w)?;
    if cmd.has_subcommands() {
        man.render_subcommands_section(&mut w)?;
    }
    if let (false, Some(notes)) = (top, cmd.get_after_help()) {
        writeln!(w, ".SH NOTES")?;
        for para in notes.to_string().split("\n\n") {
            writeln!(w, ".PP")?;
            let mut lines = para.lines().peekable();
            while let Some(line) = lines.next() {
                if line.starts_with("  ") {
                    // Indented example lines keep their layout (no filling).
                    writeln!(w, ".nf\n{}", roff_text(line))?;
                    while let Some(l) = lines.next_if(|l| l.starts_with("  ")) {
                        writeln!(w, "{}", roff_text(l))?;
                    }
                    writeln!(w, ".fi")?;
                } else {
                    writeln!(w, "{}", roff_text(line))?;
                }
            }
        }
    }
    writeln!(w, ".SH \"EXIT STATUS\"")?;
    for (code, meaning) in exit::TABLE {
        writeln!(w, ".TP\n\\fB{code}\\fR\n{}", roff_text(meaning))?;
    }
    if top {
        writeln!(w, ".SH ENVIRONMENT\n.TP\n\\fBVEILFS_LOG\\fR")?;
        writeln!(
            w,
            "{}",
            roff_text(
                "Log filter in the syntax of tracing's EnvFilter (for example debug, or warn,veilfs_core=trace). \
                 When set to a valid filter it replaces the level chosen by -v and -q for log lines."
            )
        )?;
        writeln!(w, ".SH FILES\n.TP\n\\fICIPHERDIR\\fR/veilfs.conf")?;
        writeln!(w, "{}", roff_text("The vault config: format, cipher, key slots (see veilfs-info(1))."))?;
    }
    writeln!(w, ".SH \"SEE ALSO\"")?;
    let mut see: Vec<String> = Vec::new();
    if !top {
        see.push("veilfs(1)".into());
    }
    see.extend(["fusermount3(1)".into(), "fuse(8)".into()]);
    writeln!(w, "{}", roff_text(&see.join(", ")))?;
    w.flush().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
