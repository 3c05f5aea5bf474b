//! `moek bench --plot FILE.svg`: each measured figure of the model bench against its roof, per
//! storage format, so how far each is from its floor shows at a glance. Decode tokens/s stand
//! beside the ceiling the probed read bandwidth gives for the bytes a step reads; prefill GFLOP/s
//! beside its roof: the level's GEMM peak (the MAC peak the prefill kernels aim at), or where
//! the weights cannot be read that fast (AMX), the probed bandwidth times FLOPs per weight byte.

use super::model::ModelFigures;
use crate::commands::CommandError;
use plotters::prelude::*;
use std::path::Path;

/// One panel's figure and roof, read from a run.
struct Panel {
    title: &'static str,
    unit: &'static str,
    figure: fn(&ModelFigures) -> f64,
    roof: fn(&ModelFigures) -> f64,
    roof_name: &'static str,
}

const PANELS: [Panel; 2] = [
    Panel {
        title: "decode",
        unit: "tokens/s",
        figure: |f| f.decode_tokens_per_s,
        roof: |f| f.decode_ceiling_tokens_per_s,
        roof_name: "ceiling: probed read bandwidth / bytes a step reads",
    },
    Panel {
        title: "prefill",
        unit: "GFLOP/s",
        figure: |f| f.prefill_gflops,
        roof: |f| f.prefill_roof_gflops,
        roof_name: "roof: the level's GEMM peak (bf16, or vpdpbusd for the integer GEMM), or bandwidth x FLOPs per weight byte if lower",
    },
];

/// The storage format a run stands for on the x axis.
fn format_of(f: &ModelFigures) -> String {
    f.quantized.clone().unwrap_or_else(|| "bf16".into())
}

/// Draws `runs` (one per storage format) into the SVG at `path`.
pub fn draw(path: &Path, runs: &[ModelFigures]) -> Result<(), CommandError> {
    let failed = |e: &dyn std::fmt::Display| {
        CommandError::Usage(format!("`--plot {}`: {e}", path.display()))
    };
    let Some(first) = runs.first() else {
        return Err(failed(&"no run to draw"));
    };
    let root = SVGBackend::new(path, (1100, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(&e))?;
    let caption = format!(
        "{} x {} layers, {} ({}, {} threads), read bandwidth {:.1} GB/s",
        first.geometry,
        first.layers,
        first.backend,
        first.isa,
        first.threads,
        first.read_bandwidth_gbs
    );
    let root = root
        .titled(&caption, ("sans-serif", 18))
        .map_err(|e| failed(&e))?;
    let halves = root.split_evenly((1, PANELS.len()));
    for (area, panel) in halves.iter().zip(&PANELS) {
        draw_panel(area, panel, runs).map_err(|e| failed(&e))?;
    }
    root.present().map_err(|e| failed(&e))
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw_panel(
    area: &Area<'_>,
    panel: &Panel,
    runs: &[ModelFigures],
) -> Result<(), DrawingAreaErrorKind<std::io::Error>> {
    let top = runs
        .iter()
        .map(|f| (panel.roof)(f).max((panel.figure)(f)))
        .fold(0.0, f64::max)
        * 1.4;
    let n = runs.len();
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{} ({}) against its roof", panel.title, panel.unit),
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..top.max(1.0))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() > 1e-6 || i < 0.0 {
                return String::new();
            }
            runs.get(i as usize).map(format_of).unwrap_or_default()
        })
        .y_desc(panel.unit)
        .draw()?;
    let measured = RGBColor(49, 104, 178);
    chart
        .draw_series(runs.iter().enumerate().map(|(i, f)| {
            let x = i as f64;
            Rectangle::new(
                [(x - 0.25, 0.0), (x + 0.25, (panel.figure)(f))],
                measured.filled(),
            )
        }))?
        .label("measured")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], measured.filled()));
    chart
        .draw_series(runs.iter().enumerate().map(|(i, f)| {
            let (x, roof) = (i as f64, (panel.roof)(f));
            PathElement::new(
                vec![(x - 0.35, roof), (x + 0.35, roof)],
                BLACK.stroke_width(3),
            )
        }))?
        .label(panel.roof_name)
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], BLACK.stroke_width(3)));
    chart.draw_series(runs.iter().enumerate().map(|(i, f)| {
        let (figure, roof) = ((panel.figure)(f), (panel.roof)(f));
        Text::new(
            format!("{figure:.1} = {:.0}%", figure / roof * 100.0),
            (i as f64 - 0.25, figure + top * 0.05),
            ("sans-serif", 13),
        )
    }))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::bench::model::StepParts;

    fn run(quantized: Option<&str>, decode: f64, ceiling: f64, gflops: f64) -> ModelFigures {
        ModelFigures {
            geometry: "26b-a4b".into(),
            layers: 2,
            backend: "cpu".into(),
            weights: "memory".into(),
            variant: None,
            quantized: quantized.map(Into::into),
            quantized_scope: quantized.map(|_| "whole"),
            isa: "avx2",
            threads: 2,
            prompt_tokens: 512,
            prefill_runs: 3,
            decode_steps: 8,
            prefill_tokens_per_s: 100.0,
            prefill_gflops: gflops,
            isa_peak_gflops: 300.0,
            integer_peak_gflops: None,
            f32_peak_gflops: 300.0,
            prefill_weight_bytes: 1e9,
            prefill_roof_gflops: 300.0,
            prefill_moe_roof_gflops: 300.0,
            bf16_gemm: "fma",
            decode_tokens_per_s: decode,
            decode_ceiling_tokens_per_s: ceiling,
            decode_bandwidth_ratio: decode / ceiling,
            decode_step_ms: StepParts {
                lm_head: 1.0,
                moe: 1.0,
                dense_mlp: 1.0,
                rest: 1.0,
            },
            moe_decode_ms_per_layer: 1.0,
            moe_decode_bytes_per_layer: 1e6,
            moe_decode_bandwidth_ratio: 0.9,
            moe_prefill_ms_per_token_layer: 0.5,
            prefill_moe_gflops: 1.0,
            prefill_rest_gflops: 1.0,
            prefill_head_ms: 1.0,
            bytes_per_decode_step: 1e9,
            read_bandwidth_gbs: 25.0,
            read_bandwidth_range_gbs: [24.0, 26.0],
            peak_rss_bytes: 1,
            weights_bytes: 1,
            decode_step_uploaded_weight_bytes: None,
            decode_step_uploaded_other_bytes: None,
        }
    }

    #[test]
    fn every_run_is_drawn_with_its_share_of_the_roof() {
        let path = std::env::temp_dir().join(format!("moek-plot-{}.svg", std::process::id()));
        let runs = [
            run(None, 9.0, 10.0, 150.0),
            run(Some("q4_0"), 20.0, 40.0, 60.0),
        ];
        draw(&path, &runs).expect("drawn");
        let svg = std::fs::read_to_string(&path).expect("written");
        std::fs::remove_file(&path).ok();
        for text in [
            "bf16",
            "q4_0",
            "9.0 = 90%",
            "20.0 = 50%",
            "150.0 = 50%",
            "60.0 = 20%",
        ] {
            assert!(svg.contains(text), "`{text}` missing from the plot");
        }
        assert!(
            draw(&path, &[]).is_err(),
            "no run is an error, not an empty plot"
        );
    }
}
