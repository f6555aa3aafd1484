//! The figures of a [`Report`], drawn the way the seed papers draw them, as SVG and PNG:
//!
//! - `throughput-WORKLOAD`: the headline median against threads, one line per target, with a
//!   min–max error bar per point (a bar chart per target when the workload ran at one thread
//!   count only; `recovery` is then drawn as the bar chart `recovery`).
//! - `fsync-cdf-WORKLOAD`: the fsync latency CDF of the median run at the largest thread count.
//! - `engine-WORKLOAD`: handles, conflicts and flushes per journal transaction against threads.
//! - `locks-WORKLOAD`: milliseconds waited for each journal lock against threads (quill targets).
//!
//! Every piece of text is placed by this module with an anchor, never measured by plotters, so
//! the SVGs (whose `<text>` elements the viewer lays out) need no font. The PNGs rasterize their
//! text with ab_glyph, which needs a TrueType font: the first of `$QUILL_PLOT_FONT` and a few
//! usual DejaVu/Liberation paths that exists is loaded once; without one the PNGs are skipped
//! and [`PlotFiles::skipped`] says so.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle, FontTransform};

use crate::results::{EngineFigures, Report, RunResult, Summary};
use crate::workloads::open_loop_rate;

/// Files written by [`write_plots`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlotFiles {
    pub files: Vec<PathBuf>,
    /// Why some PNGs were not drawn (e.g. no font), empty if none.
    pub skipped: Vec<String>,
}

/// Why the figures could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("cannot create the plot directory {}: {source}", path.display())]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error("cannot write {}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot draw {}: {message}", path.display())]
    Draw { path: PathBuf, message: String },
}

/// The env var naming a TrueType font for the PNGs, tried before [`FONT_PATHS`].
pub const FONT_ENV: &str = "QUILL_PLOT_FONT";

/// Where the PNGs' font is looked for, after `$QUILL_PLOT_FONT`.
pub const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Draws every figure for `report` into `dir` (created if missing) as NAME.svg and NAME.png.
pub fn write_plots(report: &Report, dir: &Path) -> Result<PlotFiles, PlotError> {
    let figures = figures(report);
    if figures.is_empty() {
        return Ok(PlotFiles::default());
    }
    write_figures(&figures, dir, load_font())
}

/// Loads and registers the PNGs' font once per process: `Ok(path)` of the font used, or
/// `Err(why)` naming every path tried.
fn load_font() -> Result<&'static Path, &'static str> {
    static FONT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let font = FONT.get_or_init(|| {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(path) = std::env::var_os(FONT_ENV).filter(|p| !p.is_empty()) {
            candidates.push(PathBuf::from(path));
        }
        candidates.extend(FONT_PATHS.iter().map(PathBuf::from));
        let mut tried = Vec::new();
        for path in candidates {
            match std::fs::read(&path) {
                Ok(bytes) => {
                    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                    if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                        return Ok(path);
                    }
                    tried.push(format!("{} (not a usable font)", path.display()));
                }
                Err(_) => tried.push(path.display().to_string()),
            }
        }
        Err(format!(
            "PNG figures not drawn: no font for their text (set {FONT_ENV}; tried {})",
            tried.join(", ")
        ))
    });
    match font {
        Ok(path) => Ok(path),
        Err(why) => Err(why),
    }
}

/// Writes `figures` into `dir`: SVGs always, PNGs when `font` is `Ok`.
fn write_figures(
    figures: &[Figure],
    dir: &Path,
    font: Result<&Path, &str>,
) -> Result<PlotFiles, PlotError> {
    let mut out = PlotFiles::default();
    if figures.is_empty() {
        return Ok(out);
    }
    std::fs::create_dir_all(dir)
        .map_err(|source| PlotError::CreateDir { path: dir.to_path_buf(), source })?;
    if let Err(why) = font {
        out.skipped.push(why.to_string());
    }
    for fig in figures {
        let path = dir.join(format!("{}.svg", fig.name));
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, fig.size).into_drawing_area();
            draw_figure(&root, fig)
                .and_then(|()| root.present())
                .map_err(|e| PlotError::Draw { path: path.clone(), message: e.to_string() })?;
        }
        std::fs::write(&path, svg)
            .map_err(|source| PlotError::Write { path: path.clone(), source })?;
        out.files.push(path);

        if font.is_ok() {
            let path = dir.join(format!("{}.png", fig.name));
            let drawn = {
                let root = BitMapBackend::new(&path, fig.size).into_drawing_area();
                draw_figure(&root, fig).and_then(|()| root.present())
            };
            if let Err(e) = drawn {
                // The backend may have saved a half-drawn picture when it was dropped.
                let _ = std::fs::remove_file(&path);
                return Err(PlotError::Draw { path, message: e.to_string() });
            }
            out.files.push(path);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// What to draw, worked out from the report before any drawing.

/// One figure: a title, one or more panels side by side, and a legend on the right.
#[derive(Debug)]
struct Figure {
    /// The file name without extension: lower-case, `[a-z0-9-]` only, unique in the report.
    name: String,
    title: String,
    size: (u32, u32),
    /// (colour index, label) of every target drawn.
    legend: Vec<(usize, String)>,
    panels: Vec<Panel>,
}

#[derive(Debug)]
struct Panel {
    title: Option<String>,
    x: XAxis,
    x_label: String,
    y: YAxis,
    y_label: String,
    mark: Mark,
    series: Vec<Series>,
}

#[derive(Debug)]
enum XAxis {
    /// Evenly spaced categories at 0, 1, 2, ... with these labels (thread counts, targets).
    Categories(Vec<String>),
    /// log10 of the values, from `lo` to `hi` (whole decades).
    Log10 { lo: f64, hi: f64 },
}

#[derive(Debug, Clone, Copy)]
enum YAxis {
    /// From zero (or the least value, if negative) to a round number above the largest.
    Linear,
    /// 0 to 1.
    Fraction,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mark {
    /// Lines with point markers and min–max error bars.
    Lines,
    /// A step line through the points (a CDF), starting from fraction 0.
    Steps,
    /// One bar per point, with its min–max error bar.
    Bars,
}

#[derive(Debug)]
struct Series {
    colour: usize,
    points: Vec<DataPoint>,
}

#[derive(Debug, Clone, Copy)]
struct DataPoint {
    x: f64,
    y: f64,
    /// (min, max) for an error bar.
    err: Option<(f64, f64)>,
}

/// File names are `[a-z0-9-]`: anything else becomes `-`, runs of `-` collapse.
fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    if out.is_empty() {
        out.push_str("unnamed");
    }
    out
}

/// Hands out unique file names (workloads whose names differ only in punctuation).
#[derive(Default)]
struct Names(HashSet<String>);

impl Names {
    fn claim(&mut self, base: String) -> String {
        let mut name = base.clone();
        let mut n = 2;
        while !self.0.insert(name.clone()) {
            name = format!("{base}-{n}");
            n += 1;
        }
        name
    }
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

fn threads_label(threads: usize) -> String {
    if threads == 1 {
        "1 thread".to_string()
    } else {
        format!("{threads} threads")
    }
}

/// First-seen order of `key` over `items`.
fn first_seen<'a, T>(items: &'a [T], key: impl Fn(&'a T) -> &'a str) -> Vec<&'a str> {
    let mut seen: Vec<&str> = Vec::new();
    for item in items {
        let k = key(item);
        if !seen.contains(&k) {
            seen.push(k);
        }
    }
    seen
}

/// Sorted distinct thread counts of `sums`.
fn thread_counts(sums: &[&Summary]) -> Vec<usize> {
    let mut threads: Vec<usize> = sums.iter().map(|s| s.threads).collect();
    threads.sort_unstable();
    threads.dedup();
    threads
}

const SIZE: (u32, u32) = (1024, 640);
const ENGINE_SIZE: (u32, u32) = (1536, 560);

/// Every figure of `report`, in the order of the workloads' first appearance.
fn figures(report: &Report) -> Vec<Figure> {
    let targets = first_seen(&report.summaries, |s| s.target.as_str());
    let colour = |target: &str| targets.iter().position(|t| *t == target).unwrap_or(0);
    let mut names = Names::default();
    let mut figures = Vec::new();
    for workload in first_seen(&report.summaries, |s| s.workload.as_str()) {
        let sums: Vec<&Summary> =
            report.summaries.iter().filter(|s| s.workload == workload).collect();
        let wl_targets = first_seen(&sums, |s| s.target.as_str());
        let threads = thread_counts(&sums);
        let y_label = sums[0].headline.label().to_string();
        let legend: Vec<(usize, String)> =
            wl_targets.iter().map(|t| (colour(t), t.to_string())).collect();

        // 1. The headline against threads, or per target at the one thread count.
        if threads.len() == 1 {
            let bars: Vec<Series> = wl_targets
                .iter()
                .enumerate()
                .filter_map(|(i, t)| {
                    let s = sums.iter().find(|s| s.target == *t)?;
                    Some(Series {
                        colour: colour(t),
                        points: vec![DataPoint {
                            x: i as f64,
                            y: finite(s.median)?,
                            err: finite(s.min).zip(finite(s.max)),
                        }],
                    })
                })
                .collect();
            let name = if workload == "recovery" {
                "recovery".to_string()
            } else {
                format!("throughput-{}", slug(workload))
            };
            figures.push(Figure {
                name: names.claim(name),
                title: format!("{workload} ({})", threads_label(threads[0])),
                size: SIZE,
                legend: legend.clone(),
                panels: vec![Panel {
                    title: None,
                    x: XAxis::Categories(wl_targets.iter().map(|t| t.to_string()).collect()),
                    x_label: "target".to_string(),
                    y: YAxis::Linear,
                    y_label: y_label.clone(),
                    mark: Mark::Bars,
                    series: bars,
                }],
            });
        } else {
            let series = wl_targets
                .iter()
                .map(|t| Series {
                    colour: colour(t),
                    points: threads
                        .iter()
                        .enumerate()
                        .filter_map(|(i, &n)| {
                            let s = sums.iter().find(|s| s.target == *t && s.threads == n)?;
                            Some(DataPoint {
                                x: i as f64,
                                y: finite(s.median)?,
                                err: finite(s.min).zip(finite(s.max)),
                            })
                        })
                        .collect(),
                })
                .collect();
            figures.push(Figure {
                name: names.claim(format!("throughput-{}", slug(workload))),
                title: workload.to_string(),
                size: SIZE,
                legend: legend.clone(),
                panels: vec![Panel {
                    title: None,
                    x: XAxis::Categories(threads.iter().map(|n| n.to_string()).collect()),
                    x_label: "threads".to_string(),
                    y: YAxis::Linear,
                    y_label,
                    mark: Mark::Lines,
                    series,
                }],
            });
        }

        // 2. The fsync latency CDF of the median runs at the largest thread count.
        let with_cdf: Vec<&Summary> =
            sums.iter().copied().filter(|s| !s.median_run.fsync_cdf.is_empty()).collect();
        if let Some(most) = with_cdf.iter().map(|s| s.threads).max() {
            let at_most: Vec<&Summary> =
                with_cdf.iter().copied().filter(|s| s.threads == most).collect();
            let mut series = Vec::new();
            let mut legend = Vec::new();
            for t in first_seen(&at_most, |s| s.target.as_str()) {
                let Some(s) = at_most.iter().find(|s| s.target == t) else { continue };
                let points: Vec<DataPoint> = s
                    .median_run
                    .fsync_cdf
                    .iter()
                    .filter_map(|&(us, fraction)| {
                        Some(DataPoint {
                            x: (us.max(1) as f64).log10(),
                            y: finite(fraction)?.clamp(0.0, 1.0),
                            err: None,
                        })
                    })
                    .collect();
                legend.push((colour(t), t.to_string()));
                series.push(Series { colour: colour(t), points });
            }
            let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.x));
            let lo = xs.clone().fold(f64::INFINITY, f64::min);
            let hi = xs.fold(f64::NEG_INFINITY, f64::max);
            let (lo, hi) = if lo.is_finite() && hi.is_finite() {
                let (lo, hi) = (lo.floor().max(0.0), hi.ceil());
                (lo, if hi > lo { hi } else { lo + 1.0 })
            } else {
                (0.0, 1.0)
            };
            figures.push(Figure {
                name: names.claim(format!("fsync-cdf-{}", slug(workload))),
                title: format!("{workload}: fsync latency CDF at {}", threads_label(most)),
                size: SIZE,
                legend,
                panels: vec![Panel {
                    title: None,
                    x: XAxis::Log10 { lo, hi },
                    x_label: "fsync latency (us, log scale)".to_string(),
                    y: YAxis::Fraction,
                    y_label: "fraction of fsyncs".to_string(),
                    mark: Mark::Steps,
                    series,
                }],
            });
        }

        // 3. The journal engine's counters against threads.
        let with_engine: Vec<&Summary> =
            sums.iter().copied().filter(|s| s.median_run.engine.is_some()).collect();
        if !with_engine.is_empty() {
            let threads = thread_counts(&with_engine);
            let eng_targets = first_seen(&with_engine, |s| s.target.as_str());
            type Metric = fn(&EngineFigures) -> f64;
            let metrics: [(&str, &str, Metric); 3] = [
                ("handles per transaction", "handles / transaction", |e| e.handles_per_transaction),
                ("conflicts per transaction", "conflicts / transaction", |e| {
                    e.conflicts_per_transaction
                }),
                ("flushes per transaction", "flushes / transaction", |e| e.flushes_per_transaction),
            ];
            let panel =
                |title: &str, y_label: &str, metric: &dyn Fn(&EngineFigures) -> f64| Panel {
                    title: Some(title.to_string()),
                    x: XAxis::Categories(threads.iter().map(|n| n.to_string()).collect()),
                    x_label: "threads".to_string(),
                    y: YAxis::Linear,
                    y_label: y_label.to_string(),
                    mark: Mark::Lines,
                    series: eng_targets
                        .iter()
                        .map(|t| Series {
                            colour: colour(t),
                            points: threads
                                .iter()
                                .enumerate()
                                .filter_map(|(i, &n)| {
                                    let s = with_engine
                                        .iter()
                                        .find(|s| s.target == *t && s.threads == n)?;
                                    let e = s.median_run.engine.as_ref()?;
                                    Some(DataPoint {
                                        x: i as f64,
                                        y: finite(metric(e))?,
                                        err: None,
                                    })
                                })
                                .collect(),
                        })
                        .collect(),
                };
            let panels = metrics
                .iter()
                .map(|&(title, y_label, metric)| panel(title, y_label, &metric))
                .collect();
            // 4. The lock-contention breakdown (FAST'18): ms waited per lock against threads.
            let lock_names: Vec<String> = with_engine
                .iter()
                .filter_map(|s| s.median_run.engine.as_ref())
                .flat_map(|e| e.lock_wait_ms.iter().map(|(n, _)| n.clone()))
                .fold(Vec::new(), |mut seen, n| {
                    if !seen.contains(&n) {
                        seen.push(n);
                    }
                    seen
                });
            if !lock_names.is_empty() {
                let lock_panels = lock_names
                    .iter()
                    .map(|name| panel(name, "ms waited", &|e: &EngineFigures| e.lock_wait(name)))
                    .collect();
                figures.push(Figure {
                    name: names.claim(format!("locks-{}", slug(workload))),
                    title: format!("{workload}: lock waits"),
                    size: ENGINE_SIZE,
                    legend: eng_targets.iter().map(|t| (colour(t), t.to_string())).collect(),
                    panels: lock_panels,
                });
            }
            figures.push(Figure {
                name: names.claim(format!("engine-{}", slug(workload))),
                title: format!("{workload}: journal engine"),
                size: ENGINE_SIZE,
                legend: eng_targets.iter().map(|t| (colour(t), t.to_string())).collect(),
                panels,
            });
        }
    }
    figures.extend(open_loop_figures(report, &colour, &mut names));
    figures
}

/// For each workload run open loop at two rates or more: the response time p99 and the
/// served rate against the offered rate, per target, at the largest pool size.
fn open_loop_figures(
    report: &Report,
    colour: &dyn Fn(&str) -> usize,
    names: &mut Names,
) -> Vec<Figure> {
    let open: Vec<&Summary> =
        report.summaries.iter().filter(|s| open_loop_rate(&s.workload).is_some()).collect();
    let base = |s: &&Summary| s.workload.split('@').next().unwrap_or("").to_string();
    let mut bases: Vec<String> = Vec::new();
    for b in open.iter().map(base) {
        if !bases.contains(&b) {
            bases.push(b);
        }
    }
    let mut figures = Vec::new();
    for workload in bases {
        let sums: Vec<&Summary> = open.iter().copied().filter(|s| base(s) == workload).collect();
        let Some(pool) = sums.iter().map(|s| s.threads).max() else { continue };
        let sums: Vec<&Summary> = sums.into_iter().filter(|s| s.threads == pool).collect();
        let mut rates: Vec<f64> = sums.iter().filter_map(|s| open_loop_rate(&s.workload)).collect();
        rates.sort_by(f64::total_cmp);
        rates.dedup();
        if rates.len() < 2 {
            continue;
        }
        let targets = first_seen(&sums, |s| s.target.as_str());
        let panel = |title: &str, y_label: &str, metric: &dyn Fn(&RunResult) -> f64| Panel {
            title: Some(title.to_string()),
            x: XAxis::Categories(rates.iter().map(|r| r.to_string()).collect()),
            x_label: "offered iterations/s".to_string(),
            y: YAxis::Linear,
            y_label: y_label.to_string(),
            mark: Mark::Lines,
            series: targets
                .iter()
                .map(|t| Series {
                    colour: colour(t),
                    points: rates
                        .iter()
                        .enumerate()
                        .filter_map(|(i, &rate)| {
                            let s = sums.iter().find(|s| {
                                s.target == *t && open_loop_rate(&s.workload) == Some(rate)
                            })?;
                            Some(DataPoint {
                                x: i as f64,
                                y: finite(metric(&s.median_run))?,
                                err: None,
                            })
                        })
                        .collect(),
                })
                .collect(),
        };
        figures.push(Figure {
            name: names.claim(format!("open-loop-{}", slug(&workload))),
            title: format!("{workload}, open loop: {}", threads_label(pool)),
            size: ENGINE_SIZE,
            legend: targets.iter().map(|t| (colour(t), t.to_string())).collect(),
            panels: vec![
                panel("response p99", "ms from arrival", &|r| r.response_us_p99 as f64 / 1000.0),
                panel("response mean", "ms from arrival", &|r| r.response_us_mean as f64 / 1000.0),
                panel("served", "iterations/s", &RunResult::served_per_sec),
            ],
        });
    }
    figures
}

// ---------------------------------------------------------------------------------------------
// Axes: ranges, ticks and their labels.

/// A round step near `raw` (1, 2 or 5 times a power of ten).
fn nice_step(raw: f64) -> f64 {
    let exp = 10f64.powf(raw.log10().floor());
    let f = raw / exp;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * exp
}

/// A linear range holding zero and every finite value, widened to round ticks, and the ticks.
fn linear_axis(values: impl Iterator<Item = f64>) -> ((f64, f64), Vec<f64>) {
    let (mut lo, mut hi) = (0.0f64, 0.0f64);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if hi - lo <= 0.0 || !(hi - lo).is_finite() {
        // All zero (or nothing finite): any non-empty range will do.
        return ((0.0, 1.0), (0..=5).map(|i| i as f64 * 0.2).collect());
    }
    if hi > 0.0 {
        hi += (hi - lo) * 0.05;
    }
    let step = nice_step((hi - lo) / 5.0);
    if !(step > 0.0 && step.is_finite()) {
        return ((0.0, 1.0), (0..=5).map(|i| i as f64 * 0.2).collect());
    }
    let (lo, hi) = ((lo / step).floor() * step, (hi / step).ceil() * step);
    let n = ((hi - lo) / step).round().clamp(1.0, 20.0) as usize;
    ((lo, hi), (0..=n).map(|i| lo + i as f64 * step).collect())
}

/// Ticks of a log10 axis from decade `lo` to decade `hi`: every decade, plus 2 and 5 times
/// each when the axis spans two decades or less.
fn log_ticks(lo: f64, hi: f64) -> Vec<(f64, String)> {
    let (lo, hi) = (lo as i32, hi as i32);
    let every = ((hi - lo) / 8).max(1);
    let mut ticks = Vec::new();
    for d in lo..=hi {
        if (d - lo) % every == 0 {
            ticks.push((d as f64, fmt_num(10f64.powi(d))));
        }
        if hi - lo <= 2 && d < hi {
            for m in [2.0, 5.0] {
                let v = m * 10f64.powi(d);
                ticks.push((v.log10(), fmt_num(v)));
            }
        }
    }
    ticks
}

/// A short axis label: 0.25, 40, 2.5k, 12M.
fn fmt_num(v: f64) -> String {
    let a = v.abs();
    let (scaled, suffix) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let mut s = format!("{scaled:.3}");
    while s.ends_with('0') {
        s.pop();
    }
    if s.ends_with('.') {
        s.pop();
    }
    if s == "-0" {
        s = "0".to_string();
    }
    format!("{s}{suffix}")
}

// ---------------------------------------------------------------------------------------------
// Drawing. Text is always drawn on the root with an explicit anchor, so no text is measured.

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Colours by target, in order of first appearance (Tableau 10).
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
const GRID: RGBColor = RGBColor(225, 225, 225);
const TITLE_HEIGHT: u32 = 48;
const FONT: &str = "sans-serif";

fn colour_of(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

fn text(size: f64, h: HPos, v: VPos) -> TextStyle<'static> {
    (FONT, size).into_font().color(&BLACK).pos(Pos::new(h, v))
}

/// A rough width of `s` in pixels at `size` (plotters' size is 1.24 × the em size), used only
/// to size the legend and shorten labels: nothing is measured with the font.
fn text_width(s: &str, size: f64) -> i32 {
    (s.chars().count() as f64 * size / 1.24 * 0.6).ceil() as i32
}

/// `s`, shortened with "..." to about `width` pixels at `size`.
fn fit(s: &str, width: i32, size: f64) -> String {
    if text_width(s, size) <= width {
        return s.to_string();
    }
    let keep = ((width as f64 / (size / 1.24 * 0.6)) as usize).saturating_sub(3).max(1);
    let mut out: String = s.chars().take(keep).collect();
    out.push_str("...");
    out
}

/// `s`, shortened in the middle with "..." to about `width` pixels at `size`: legend labels
/// that differ only at their ends stay apart.
fn fit_middle(s: &str, width: i32, size: f64) -> String {
    if text_width(s, size) <= width {
        return s.to_string();
    }
    let keep = ((width as f64 / (size / 1.24 * 0.6)) as usize).saturating_sub(3).max(2);
    let chars: Vec<char> = s.chars().collect();
    let head = keep / 2;
    let tail = keep - head;
    let mut out: String = chars[..head].iter().collect();
    out.push_str("...");
    out.extend(&chars[chars.len() - tail..]);
    out
}

/// A marker centred on `at` (pixels): circles for the first ten targets, then triangles,
/// squares and diamonds-as-crosses, so more than ten targets stay apart.
fn draw_marker<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    at: (i32, i32),
    colour: usize,
) -> DrawResult<DB> {
    let c = colour_of(colour);
    match (colour / PALETTE.len()) % 4 {
        0 => root.draw(&Circle::new(at, 5, c.filled())),
        1 => root.draw(&TriangleMarker::new(at, 6, c.filled())),
        2 => root.draw(&Rectangle::new([(at.0 - 4, at.1 - 4), (at.0 + 4, at.1 + 4)], c.filled())),
        _ => root.draw(&Cross::new(at, 5, c.stroke_width(2))),
    }
}

fn draw_figure<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, fig: &Figure) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let (w, _) = root.dim_in_pixel();
    root.draw(&Text::new(
        fig.title.clone(),
        (w as i32 / 2, 14),
        text(26.0, HPos::Center, VPos::Top),
    ))?;
    // Labels too long for the legend lose the prefix they all share, which heads the legend
    // instead: `lib:dev=simssd,ssd=970pro,` over `preset=cjfs`, `preset=barrierfs`, ...
    let widest = (w as i32 * 3 / 10).max(140);
    let too_long = fig.legend.iter().any(|(_, l)| text_width(l, 17.0) + 60 > widest);
    let labels: Vec<String> = fig.legend.iter().map(|(_, l)| l.clone()).collect();
    let shared = if too_long { crate::report::shared_label_prefix(&labels) } else { 0 };
    // `shared` may pass the end of a label the others extend (`a` beside `a,b=1`) by one: such
    // a label is shown by its last setting.
    let heading = (shared > 0).then(|| {
        let first = &labels[0];
        first[..shared.min(first.len())].to_string()
    });
    let entries: Vec<(usize, String)> = fig
        .legend
        .iter()
        .map(|(c, l)| {
            let text = if shared == 0 {
                l.clone()
            } else if l.len() > shared {
                l[shared..].to_string()
            } else {
                l[l.rfind([':', ',']).map_or(0, |i| i + 1)..].to_string()
            };
            (*c, text)
        })
        .collect();
    let longest = entries.iter().map(|(_, l)| text_width(l, 17.0)).max().unwrap_or(0);
    let legend_width = (longest + 60).clamp(140, widest) as u32;
    let (_, body) = root.split_vertically(TITLE_HEIGHT);
    let (plots, legend) = body.split_horizontally(w.saturating_sub(legend_width));
    let areas = plots.split_evenly((1, fig.panels.len().max(1)));
    for (panel, area) in fig.panels.iter().zip(&areas) {
        draw_panel(root, area, panel)?;
    }
    let mark = fig.panels.first().map_or(Mark::Lines, |p| p.mark);
    draw_legend(root, &legend, heading.as_deref(), &entries, legend_width as i32, mark)
}

fn draw_legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    area: &DrawingArea<DB, Shift>,
    heading: Option<&str>,
    entries: &[(usize, String)],
    width: i32,
    mark: Mark,
) -> DrawResult<DB> {
    let (xs, ys) = area.get_pixel_range();
    let x = xs.start + 8;
    let mut top = ys.start + 30;
    if let Some(heading) = heading {
        root.draw(&Text::new(
            fit(heading, width - 12, 15.0),
            (x, top),
            text(15.0, HPos::Left, VPos::Center),
        ))?;
        top += 26;
    }
    for (i, (colour, label)) in entries.iter().enumerate() {
        let y = top + i as i32 * 26;
        if y > ys.end - 10 {
            break;
        }
        let c = colour_of(*colour);
        match mark {
            Mark::Bars => {
                root.draw(&Rectangle::new([(x + 6, y - 9), (x + 24, y + 9)], c.filled()))?
            }
            Mark::Steps => {
                root.draw(&PathElement::new(vec![(x, y), (x + 30, y)], c.stroke_width(3)))?
            }
            Mark::Lines => {
                root.draw(&PathElement::new(vec![(x, y), (x + 30, y)], c.stroke_width(3)))?;
                draw_marker(root, (x + 15, y), *colour)?;
            }
        }
        root.draw(&Text::new(
            fit_middle(label, width - 50, 17.0),
            (x + 38, y),
            text(17.0, HPos::Left, VPos::Center),
        ))?;
    }
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
) -> DrawResult<DB> {
    let (x_range, x_ticks): ((f64, f64), Vec<(f64, String)>) = match &p.x {
        XAxis::Categories(labels) => (
            (-0.5, labels.len().max(1) as f64 - 0.5),
            labels.iter().enumerate().map(|(i, l)| (i as f64, l.clone())).collect(),
        ),
        XAxis::Log10 { lo, hi } => ((*lo, *hi), log_ticks(*lo, *hi)),
    };
    let (y_range, y_ticks): ((f64, f64), Vec<f64>) = match p.y {
        YAxis::Fraction => ((0.0, 1.0), (0..=5).map(|i| i as f64 * 0.2).collect()),
        YAxis::Linear => linear_axis(p.series.iter().flat_map(|s| {
            s.points.iter().flat_map(|d| {
                [Some(d.y), d.err.map(|e| e.0), d.err.map(|e| e.1)].into_iter().flatten()
            })
        })),
    };

    let chart = ChartBuilder::on(area)
        .margin_top(if p.title.is_some() { 36 } else { 12 })
        .margin_bottom(8)
        .margin_left(8)
        .margin_right(24)
        .x_label_area_size(64)
        .y_label_area_size(92)
        .build_cartesian_2d(x_range.0..x_range.1, y_range.0..y_range.1)?;
    let (px, py) = chart.plotting_area().get_pixel_range();
    let plot = chart.plotting_area().clone();

    // Grid, frame, ticks and their labels.
    for &y in &y_ticks {
        plot.draw(&PathElement::new(vec![(x_range.0, y), (x_range.1, y)], GRID))?;
        let (_, ty) = plot.map_coordinate(&(x_range.0, y));
        root.draw(&PathElement::new(vec![(px.start - 5, ty), (px.start, ty)], BLACK))?;
        root.draw(&Text::new(
            fmt_num(y),
            (px.start - 9, ty),
            text(16.0, HPos::Right, VPos::Center),
        ))?;
    }
    let slot = (px.end - px.start) / x_ticks.len().max(1) as i32;
    for (x, label) in &x_ticks {
        if p.mark != Mark::Bars {
            plot.draw(&PathElement::new(vec![(*x, y_range.0), (*x, y_range.1)], GRID))?;
        }
        let (tx, _) = plot.map_coordinate(&(*x, y_range.0));
        root.draw(&PathElement::new(vec![(tx, py.end), (tx, py.end + 5)], BLACK))?;
        let label = match p.x {
            XAxis::Categories(_) => fit(label, slot - 6, 16.0),
            XAxis::Log10 { .. } => label.clone(),
        };
        root.draw(&Text::new(label, (tx, py.end + 9), text(16.0, HPos::Center, VPos::Top)))?;
    }
    root.draw(&Rectangle::new([(px.start, py.start), (px.end, py.end)], BLACK.stroke_width(1)))?;
    let (ax, _) = area.get_pixel_range();
    let mid_y = (py.start + py.end) / 2;
    root.draw(&Text::new(
        p.x_label.clone(),
        ((px.start + px.end) / 2, py.end + 36),
        text(18.0, HPos::Center, VPos::Top),
    ))?;
    root.draw(&Text::new(
        p.y_label.clone(),
        (ax.start + 22, mid_y),
        (FONT, 18.0)
            .into_font()
            .transform(FontTransform::Rotate270)
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Center)),
    ))?;
    if let Some(title) = &p.title {
        root.draw(&Text::new(
            title.clone(),
            ((px.start + px.end) / 2, py.start - 10),
            text(19.0, HPos::Center, VPos::Bottom),
        ))?;
    }

    // The data.
    let cap = |x: f64, y: f64, colour: RGBColor| {
        let (cx, cy) = plot.map_coordinate(&(x, y));
        PathElement::new(vec![(cx - 6, cy), (cx + 6, cy)], colour.stroke_width(1))
    };
    let n_series = p.series.len();
    for (k, s) in p.series.iter().enumerate() {
        let c = colour_of(s.colour);
        // Error bars of a line chart step aside a little per target, so equal values
        // at one thread count do not hide each other's bars.
        let dodge = if p.mark == Mark::Lines {
            (k as f64 - (n_series as f64 - 1.0) / 2.0) * 0.025
        } else {
            0.0
        };
        match p.mark {
            Mark::Bars => {
                for d in &s.points {
                    plot.draw(&Rectangle::new([(d.x - 0.3, 0.0), (d.x + 0.3, d.y)], c.filled()))?;
                }
            }
            Mark::Lines => {
                let line: Vec<(f64, f64)> = s.points.iter().map(|d| (d.x, d.y)).collect();
                if line.len() > 1 {
                    plot.draw(&PathElement::new(line, c.stroke_width(2)))?;
                }
            }
            Mark::Steps => {
                let mut line = Vec::with_capacity(s.points.len() * 2 + 2);
                let mut last = 0.0;
                for d in &s.points {
                    line.push((d.x, last));
                    line.push((d.x, d.y));
                    last = d.y;
                }
                if let Some(d) = s.points.last() {
                    line.push((x_range.1.max(d.x), last));
                }
                plot.draw(&PathElement::new(line, c.stroke_width(2)))?;
            }
        }
        if p.mark != Mark::Steps {
            for d in &s.points {
                if let Some((lo, hi)) = d.err.filter(|(lo, hi)| hi > lo) {
                    let bar_colour = if p.mark == Mark::Bars { BLACK } else { c };
                    let x = d.x + dodge;
                    plot.draw(&PathElement::new(vec![(x, lo), (x, hi)], bar_colour))?;
                    root.draw(&cap(x, lo, bar_colour))?;
                    root.draw(&cap(x, hi, bar_colour))?;
                }
                if p.mark == Mark::Lines {
                    draw_marker(root, plot.map_coordinate(&(d.x, d.y)), s.colour)?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{summarize, EngineFigures, RunResult};

    /// A fresh directory under the system's temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            use std::sync::atomic::{AtomicUsize, Ordering};
            static N: AtomicUsize = AtomicUsize::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let dir =
                std::env::temp_dir().join(format!("quill-plot-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const TARGETS: [&str; 3] = ["lib", "lib:preset=cjfs", "kernel-ext4"];

    /// Three targets, four workloads, threads 1, 2 and 4 (recovery at 1), three rounds each;
    /// the quill targets have engine figures, varmail and fsync-under-load have fsync CDFs.
    fn synthetic_report() -> Report {
        let mut runs = Vec::new();
        for workload in ["varmail-shared", "tokubench", "fsync-under-load", "recovery"] {
            let threads: &[usize] = if workload == "recovery" { &[1] } else { &[1, 2, 4] };
            for (ti, target) in TARGETS.iter().enumerate() {
                for &n in threads {
                    for round in 0..3 {
                        let speed = (ti + 1) as f64 * n as f64 * (1.0 + 0.05 * round as f64);
                        let mut r = RunResult {
                            workload: workload.into(),
                            target: target.to_string(),
                            threads: n,
                            round,
                            seconds: 10.0 / speed,
                            ops: 1000,
                            files_created: 500,
                            ..Default::default()
                        };
                        r.set_rates();
                        if workload != "tokubench" {
                            let base = 200 * (ti as u64 + 1) * n as u64;
                            let samples: Vec<u64> =
                                (0..500).map(|i| base + i * i * (round as u64 + 1)).collect();
                            r.set_fsync_latencies(samples);
                        }
                        if target.starts_with("lib") {
                            r.engine = Some(EngineFigures {
                                transactions: 100,
                                handles_per_transaction: 3.0 * n as f64 + ti as f64,
                                conflicts_per_transaction: 0.1 * n as f64,
                                flushes_per_transaction: 1.0 / (ti + 1) as f64,
                                lock_wait_ms: vec![
                                    ("j_state_lock(read)".into(), n as f64),
                                    ("j_list_lock".into(), 2.0 * n as f64),
                                ],
                                ..Default::default()
                            });
                        }
                        runs.push(r);
                    }
                }
            }
        }
        let summaries = summarize(&runs, Some("kernel-ext4"));
        Report { command: "quill bench (test)".into(), runs, summaries, ..Default::default() }
    }

    const EXPECTED: [&str; 11] = [
        "throughput-varmail-shared",
        "fsync-cdf-varmail-shared",
        "engine-varmail-shared",
        "locks-varmail-shared",
        "throughput-tokubench",
        "engine-tokubench",
        "locks-tokubench",
        "throughput-fsync-under-load",
        "fsync-cdf-fsync-under-load",
        "engine-fsync-under-load",
        "locks-fsync-under-load",
    ];
    // recovery: one thread count, so a bar chart; it has CDFs and engine figures too.
    const EXPECTED_RECOVERY: [&str; 4] =
        ["recovery", "fsync-cdf-recovery", "engine-recovery", "locks-recovery"];

    fn file_names(files: &[PathBuf]) -> Vec<String> {
        let mut names: Vec<String> =
            files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn synthetic_report_draws_every_figure() {
        let report = synthetic_report();
        let tmp = TempDir::new("all");
        let out = write_plots(&report, &tmp.0).expect("plots written");
        let font = load_font();
        let bases: Vec<&str> = EXPECTED.iter().chain(EXPECTED_RECOVERY.iter()).copied().collect();
        let mut want: Vec<String> = bases.iter().map(|b| format!("{b}.svg")).collect();
        match font {
            Ok(path) => {
                println!("font: {}", path.display());
                want.extend(bases.iter().map(|b| format!("{b}.png")));
                assert!(out.skipped.is_empty(), "{:?}", out.skipped);
            }
            Err(why) => {
                println!("no font, PNGs skipped: {why}");
                assert_eq!(out.skipped, vec![why.to_string()]);
                assert!(why.contains(FONT_PATHS[0]), "{why}");
            }
        }
        want.sort();
        assert_eq!(file_names(&out.files), want);
        for f in &out.files {
            assert!(f.starts_with(&tmp.0));
            let name = f.file_stem().unwrap().to_str().unwrap();
            assert!(name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
            let bytes = std::fs::read(f).unwrap();
            if f.extension().unwrap() == "png" {
                assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{}", f.display());
                assert!(bytes.len() > 1024, "{} is {} bytes", f.display(), bytes.len());
                continue;
            }
            let svg = String::from_utf8(bytes).unwrap();
            assert!(svg.contains("<svg"), "{}", f.display());
            assert!(svg.contains("<text"), "{}", f.display());
            let workload = ["varmail-shared", "tokubench", "fsync-under-load", "recovery"]
                .into_iter()
                .find(|w| name.ends_with(w))
                .unwrap();
            assert!(svg.contains(&format!(">\n{workload}")) || svg.contains(workload), "{name}");
            let engine_only = name.starts_with("engine-") || name.starts_with("locks-");
            let targets: &[&str] = if engine_only { &TARGETS[..2] } else { &TARGETS[..] };
            for t in targets {
                assert!(svg.contains(&format!(">\n{t}\n<")), "{name} lacks {t}");
            }
            if name.starts_with("engine-") {
                assert!(!svg.contains(">\nkernel-ext4\n<"), "{name}: kernel-ext4 has no engine");
                assert!(svg.contains("conflicts per transaction"), "{name}");
            }
            if name.starts_with("locks-") {
                assert!(!svg.contains(">\nkernel-ext4\n<"), "{name}: kernel-ext4 has no locks");
                assert!(svg.contains("j_list_lock"), "{name}");
            }
        }
        let cdf = std::fs::read_to_string(tmp.0.join("fsync-cdf-varmail-shared.svg")).unwrap();
        assert!(cdf.contains("at 4 threads"), "the CDF is of the largest thread count");
        let tput = std::fs::read_to_string(tmp.0.join("throughput-tokubench.svg")).unwrap();
        assert!(tput.contains(">\nfiles/s\n<"), "the y axis is labelled by the headline");
    }

    #[test]
    fn same_target_same_colour_everywhere() {
        let report = synthetic_report();
        let figs = figures(&report);
        for fig in &figs {
            for (colour, label) in &fig.legend {
                let want = TARGETS.iter().position(|t| t == label).unwrap();
                assert_eq!(*colour, want, "{} in {}", label, fig.name);
            }
        }
    }

    #[test]
    fn open_loop_runs_at_two_rates_or_more_get_a_response_against_offered_rate_figure() {
        let mut runs = Vec::new();
        for (rates, workload) in
            [(&[100.0, 400.0][..], "varmail-shared"), (&[50.0][..], "oltp-insert")]
        {
            for &rate in rates {
                for target in ["lib", "lib:preset=cjfs"] {
                    let mut r = RunResult {
                        workload: format!("{workload}@{rate}/s"),
                        target: target.into(),
                        threads: 16,
                        seconds: 2.0,
                        ops: 100,
                        ..Default::default()
                    };
                    r.set_open_loop(rate, 2 * rate as u64, 0, vec![rate as u64 * 10; 100]);
                    r.set_rates();
                    runs.push(r);
                }
            }
        }
        let report = Report { summaries: summarize(&runs, None), runs, ..Default::default() };
        let figs = figures(&report);
        let open: Vec<&Figure> = figs.iter().filter(|f| f.name.starts_with("open-loop-")).collect();
        assert_eq!(open.len(), 1, "oltp-insert ran at one rate only");
        let fig = open[0];
        assert_eq!(fig.name, "open-loop-varmail-shared");
        assert_eq!(fig.panels.len(), 3);
        let p99 = &fig.panels[0];
        assert!(matches!(&p99.x, XAxis::Categories(c) if c == &["100", "400"]));
        let ys: Vec<f64> = p99.series[0].points.iter().map(|p| p.y).collect();
        assert_eq!(ys, [1.0, 4.0], "p99 in ms, by offered rate");
        let served: Vec<f64> = fig.panels[2].series[1].points.iter().map(|p| p.y).collect();
        assert_eq!(served, [100.0, 400.0], "arrivals over seconds, none unserved");
    }

    #[test]
    fn empty_report_writes_nothing() {
        let tmp = TempDir::new("empty");
        let out = write_plots(&Report::default(), &tmp.0).unwrap();
        assert_eq!(out, PlotFiles::default());
        assert!(!tmp.0.exists(), "nothing to draw, no directory");
    }

    #[test]
    fn degenerate_values_do_not_panic() {
        let sum = |workload: &str, target: &str, threads: usize, v: f64| {
            let runs = [RunResult {
                workload: workload.into(),
                target: target.into(),
                threads,
                ops_per_sec: v,
                files_per_sec: v,
                seconds: v,
                ..Default::default()
            }];
            summarize(&runs, None).remove(0)
        };
        let mut summaries = vec![
            // A single point.
            sum("single", "a", 8, 5.0),
            // NaN, infinity and zero among ordinary values, a target missing a thread count.
            sum("odd", "a", 1, f64::NAN),
            sum("odd", "a", 2, 0.0),
            sum("odd", "a", 4, f64::INFINITY),
            sum("odd", "b", 4, 3.0),
            // All zero.
            sum("zeros", "a", 1, 0.0),
            sum("zeros", "a", 2, 0.0),
            // All equal.
            sum("flat", "a", 1, 7.0),
            sum("flat", "b", 2, 7.0),
            // Nothing finite at all, one thread count.
            sum("recovery", "a", 1, f64::NAN),
            // A name that is not a file name, and one that collides with it.
            sum("Weird/Name  #1", "a", 1, 1.0),
            sum("weird-name-1", "a", 1, 1.0),
        ];
        summaries[1].min = f64::NAN;
        summaries[4].min = f64::NEG_INFINITY;
        summaries[4].max = 1e300;
        // CDFs with a zero latency, a NaN fraction, a single point; engine figures with NaN.
        summaries[0].median_run.fsync_cdf = vec![(0, 1.0)];
        summaries[2].median_run.fsync_cdf = vec![(0, 0.5), (0, f64::NAN), (3, 1.0)];
        summaries[4].median_run.fsync_cdf = vec![(5, f64::NAN)];
        summaries[5].median_run.engine =
            Some(EngineFigures { handles_per_transaction: f64::NAN, ..Default::default() });
        summaries[9].median_run.engine = Some(EngineFigures::default());
        // Labels too long for the legend, one the prefix of another (the legend is then headed
        // by the shared prefix, which passes the end of the shorter label).
        let long = "lib:dev=simssd,ssd=970pro,journal_mib=512";
        summaries.push(sum("long", long, 1, 1.0));
        summaries.push(sum("long", &format!("{long},preset=cjfs,commit_record=barrier"), 1, 2.0));
        let report = Report { summaries, ..Default::default() };
        let tmp = TempDir::new("odd");
        let out = write_plots(&report, &tmp.0).expect("odd data still draws");
        let names = file_names(&out.files);
        for want in [
            "throughput-single.svg",
            "fsync-cdf-single.svg",
            "throughput-odd.svg",
            "fsync-cdf-odd.svg",
            "throughput-zeros.svg",
            "engine-zeros.svg",
            "throughput-flat.svg",
            "recovery.svg",
            "engine-recovery.svg",
            "throughput-weird-name-1.svg",
            "throughput-weird-name-1-2.svg",
            "throughput-long.svg",
        ] {
            assert!(names.contains(&want.to_string()), "{want} missing from {names:?}");
        }
        for f in &out.files {
            assert!(std::fs::metadata(f).unwrap().len() > 0, "{}", f.display());
        }
    }

    #[test]
    fn axes_have_a_range_and_round_ticks() {
        assert_eq!(linear_axis([0.0, 0.0].into_iter()).0, (0.0, 1.0));
        assert_eq!(linear_axis([f64::NAN].into_iter()).0, (0.0, 1.0));
        let ((lo, hi), ticks) = linear_axis([7.0, 7.0].into_iter());
        assert_eq!((lo, *ticks.first().unwrap(), *ticks.last().unwrap()), (0.0, 0.0, hi));
        assert!((7.0..=10.0).contains(&hi), "{hi}");
        let ((lo, hi), _) = linear_axis([-3.0, 12_345.0].into_iter());
        assert!(lo <= -3.0 && hi >= 12_345.0);
        assert_eq!(fmt_num(2500.0), "2.5k");
        assert_eq!(fmt_num(0.2), "0.2");
        assert_eq!(fmt_num(1e6), "1M");
        assert_eq!(fmt_num(-0.0), "0");
        let ticks: Vec<String> = log_ticks(2.0, 3.0).into_iter().map(|t| t.1).collect();
        assert_eq!(ticks, ["100", "200", "500", "1k"]);
        assert_eq!(slug("Weird/Name  #1"), "weird-name-1");
        assert_eq!(slug("///"), "unnamed");
        let label = "preset=cjfs,commit_record=barrier,committing_max=5";
        let short = fit_middle(label, 200, 17.0);
        assert!(short.starts_with("preset=") && short.ends_with("max=5"), "{short}");
        assert!(text_width(&short, 17.0) <= 200, "{short}");
        assert_eq!(fit_middle("lib", 200, 17.0), "lib");
    }

    /// The SVGs need no font: run in a child process (where no font was ever registered), the
    /// figures are drawn without one and only the PNGs are skipped.
    #[test]
    fn svgs_need_no_font() {
        const CHILD: &str = "QUILL_PLOT_TEST_NO_FONT_CHILD";
        if std::env::var_os(CHILD).is_some() {
            let tmp = TempDir::new("nofont");
            let figs = figures(&synthetic_report());
            let out = write_figures(&figs, &tmp.0, Err("no font (test)")).expect("SVGs written");
            assert_eq!(out.skipped, vec!["no font (test)".to_string()]);
            assert_eq!(out.files.len(), figs.len());
            assert!(out.files.iter().all(|f| f.extension().unwrap() == "svg"));
            return;
        }
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["plot::tests::svgs_need_no_font", "--exact", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .expect("test binary runs");
        let stdout = String::from_utf8_lossy(&child.stdout);
        assert!(
            child.status.success() && stdout.contains("1 passed"),
            "child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&child.stderr)
        );
    }

    /// Not a test: `QUILL_PLOT_SAMPLE=DIR cargo test -p quill-bench --lib plot::tests::sample`
    /// renders the synthetic report into DIR to look at.
    #[test]
    fn sample() {
        if let Some(dir) = std::env::var_os("QUILL_PLOT_SAMPLE") {
            let out = write_plots(&synthetic_report(), Path::new(&dir)).unwrap();
            println!("{out:#?}");
        }
    }
}
