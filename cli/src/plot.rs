//! `tollgate replay --plot FILE.svg`: requests admitted (and, for one algorithm, denied) per
//! time bucket, as rates per second, with the limit as a line. With `--compare`, one admitted
//! series per algorithm. Drawn with plotters' SVG backend: no system library, no font file.

use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;
use tollgate::replay::TraceOutcome;

use crate::common::Fatal;
use crate::report::duration_text;

/// At most this many buckets are kept: past it, buckets double in width (pairs merge), so a
/// trace of any length plots in bounded memory and a readable number of steps.
const MAX_BUCKETS: usize = 1000;

/// Counts per time bucket for a few series, as the trace streams by.
pub(crate) struct Timeline {
    bucket_ns: u64,
    /// `admitted[s][i]`: requests series `s` admitted in bucket `i`.
    admitted: Vec<Vec<u64>>,
    /// Requests denied in each bucket, for a single algorithm.
    denied: Vec<u64>,
    totals: Vec<u64>,
    denied_total: u64,
    /// Requests refused as errors (a cost no wait admits): counted, not drawn.
    errors_total: u64,
    /// The bucket of the trace's latest request, plotted or not: the time axis spans the
    /// whole trace, also when `--key` plots one key.
    end: usize,
}

impl Timeline {
    /// `series` admitted series over buckets of `bucket` (at least 1 ms, the trace's unit).
    pub(crate) fn new(series: usize, bucket: Duration) -> Timeline {
        let bucket_ns = u64::try_from(bucket.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1_000_000);
        Timeline {
            bucket_ns,
            admitted: vec![Vec::new(); series],
            denied: Vec::new(),
            totals: vec![0; series],
            denied_total: 0,
            errors_total: 0,
            end: 0,
        }
    }

    fn index(&mut self, t_ms: u64) -> usize {
        let t_ns = t_ms.saturating_mul(1_000_000);
        loop {
            let index = t_ns / self.bucket_ns;
            if index < MAX_BUCKETS as u64 {
                return index as usize;
            }
            self.coarsen();
        }
    }

    /// Extends the time axis to `t_ms` (a request that is not plotted).
    pub(crate) fn reach(&mut self, t_ms: u64) {
        self.end = self.index(t_ms);
    }

    /// Doubles the bucket width, merging pairs of buckets.
    fn coarsen(&mut self) {
        fn merge(counts: &mut Vec<u64>) {
            *counts = counts.chunks(2).map(|pair| pair.iter().sum()).collect();
        }
        self.bucket_ns = self.bucket_ns.saturating_mul(2);
        self.end /= 2;
        self.admitted.iter_mut().for_each(merge);
        merge(&mut self.denied);
    }

    /// Counts one decision of series `series` at `t_ms`.
    pub(crate) fn add(&mut self, series: usize, t_ms: u64, outcome: TraceOutcome) {
        let index = self.index(t_ms);
        self.end = index;
        let counts = match outcome {
            TraceOutcome::Allow { .. } => {
                self.totals[series] += 1;
                &mut self.admitted[series]
            }
            TraceOutcome::Deny => {
                self.denied_total += 1;
                &mut self.denied
            }
            TraceOutcome::Error => {
                self.errors_total += 1;
                return;
            }
        };
        if counts.len() <= index {
            counts.resize(index + 1, 0);
        }
        counts[index] += 1;
    }
}

/// What the chart says besides the counts.
pub(crate) struct Chart<'a> {
    pub(crate) title: String,
    /// One name per admitted series (algorithm names).
    pub(crate) names: &'a [&'a str],
    /// Whether to draw the denied series (one algorithm).
    pub(crate) denied: bool,
    pub(crate) limit: u64,
    pub(crate) window: Duration,
    /// Whether the counts are one key's (else every key's, and the limit is per key).
    pub(crate) one_key: bool,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
];
const DENIED: RGBColor = RGBColor(214, 39, 40);

/// Step points of one series, in requests per second.
fn steps(counts: &[u64], buckets: usize, bucket_s: f64) -> Vec<(f64, f64)> {
    (0..buckets)
        .flat_map(|i| {
            let rate = counts.get(i).copied().unwrap_or(0) as f64 / bucket_s;
            [
                (i as f64 * bucket_s, rate),
                ((i + 1) as f64 * bucket_s, rate),
            ]
        })
        .collect()
}

/// Draws `timeline` as an SVG file at `path`.
pub(crate) fn draw(path: &Path, timeline: &Timeline, chart: &Chart) -> Result<(), Fatal> {
    let mut svg = String::new();
    render(&mut svg, timeline, chart).map_err(|e| Fatal(format!("cannot draw the plot: {e}")))?;
    std::fs::write(path, svg)
        .map_err(|e| Fatal(format!("cannot write the plot {}: {e}", path.display())))
}

fn render(
    svg: &mut String,
    timeline: &Timeline,
    chart: &Chart,
) -> Result<(), Box<dyn std::error::Error>> {
    let bucket_s = timeline.bucket_ns as f64 / 1e9;
    let buckets = timeline
        .admitted
        .iter()
        .map(Vec::len)
        .chain([timeline.denied.len()])
        .max()
        .unwrap_or(0)
        .max(timeline.end + 1);
    let limit_rate = chart.limit as f64 / chart.window.as_secs_f64();
    let series: Vec<Vec<(f64, f64)>> = timeline
        .admitted
        .iter()
        .map(|counts| steps(counts, buckets, bucket_s))
        .collect();
    let denied = steps(&timeline.denied, buckets, bucket_s);
    let highest = series
        .iter()
        .chain(chart.denied.then_some(&denied))
        .flatten()
        .map(|p| p.1)
        .fold(limit_rate, f64::max);

    let root = SVGBackend::with_string(svg, (960, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut plot = ChartBuilder::on(&root)
        .caption(&chart.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        // Headroom above the highest point for the legend box.
        .build_cartesian_2d(0f64..buckets as f64 * bucket_s, 0f64..highest * 1.45)?;
    plot.configure_mesh()
        .x_desc(format!(
            "trace time (s), buckets of {}",
            duration_text(Duration::from_nanos(timeline.bucket_ns))
        ))
        .y_desc("requests per second")
        .draw()?;
    // Series that coincide would hide one another: each is drawn thinner than the one before.
    let count = series.len() as u32;
    for (i, (points, name)) in series.into_iter().zip(chart.names).enumerate() {
        let color = COLORS[i % COLORS.len()];
        let width = 2 + count - 1 - i as u32;
        plot.draw_series(LineSeries::new(points, color.stroke_width(width)))?
            .label(format!("{name}: {} admitted", timeline.totals[i]))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    if chart.denied {
        plot.draw_series(LineSeries::new(denied, DENIED.stroke_width(1)))?
            .label(match timeline.errors_total {
                0 => format!("denied: {}", timeline.denied_total),
                errors => format!(
                    "denied: {} (errors, not drawn: {errors})",
                    timeline.denied_total
                ),
            })
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], DENIED));
    }
    let x_end = buckets as f64 * bucket_s;
    plot.draw_series(LineSeries::new(
        [(0.0, limit_rate), (x_end, limit_rate)],
        BLACK.stroke_width(1),
    ))?
    .label(format!(
        "limit: {} per {}{}",
        chart.limit,
        duration_text(chart.window),
        if chart.one_key { "" } else { " per key" }
    ))
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    plot.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_merge_past_the_cap_and_keep_their_totals() {
        let allow = TraceOutcome::Allow { delay_nanos: None };
        let mut t = Timeline::new(1, Duration::from_secs(1));
        t.add(0, 0, allow);
        t.add(0, 999_999, allow);
        t.add(0, u64::MAX, TraceOutcome::Deny);
        t.add(0, 5, TraceOutcome::Error);
        assert!(t.admitted[0].len() <= MAX_BUCKETS && t.denied.len() <= MAX_BUCKETS);
        assert_eq!(t.admitted[0].iter().sum::<u64>(), 2);
        assert_eq!((t.totals[0], t.denied_total, t.errors_total), (2, 1, 1));

        // A request of another key extends the time axis without a count.
        let mut t = Timeline::new(1, Duration::from_secs(1));
        t.add(0, 500, allow);
        t.reach(9_500);
        assert_eq!((t.admitted[0].len(), t.end), (1, 9));
    }
}
