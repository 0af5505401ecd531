"""Reports from result files, sweeps and submission bundles: tables (console, markdown, HTML, CSV, JSON) and plots.

Every figure comes from a result record or a sweep log as written; the report measures nothing and never asks an
installed plugin (a record names its plugin's settings and defaults). Runs are grouped by plugin, settings, device,
precision, mode, shape and job layout (devices, nodes, strategy), and within a group by batch size; runs that differ
in any of these are never pooled. A batch's figure is its median run (records.median_index: a run that happened);
the headline of a group is its best batch's by the rule the sweep and summary.md share (records.best_batch_runs):
where a sweep re-ran its best batch, that batch and its re-runs decide (the search trials that picked it are not
counted again); otherwise a batch with enough runs for a median, the fastest of those.

The package's modules, each one job: points (loading and grouping runs, the headline), tables, plots and render
(the formats, and `report`, which makes one); what other code uses is named here.
"""

from llmb.report.plots import efficiency_figure, make_plots, plot_panels, versus_batch_figure
from llmb.report.points import Inputs, Point, headline, load, mark_reference, point_from_record
from llmb.report.render import plot_folder, report, to_csv, to_html, to_json, to_markdown
from llmb.report.tables import Table, best_table, build_tables, comparison_tables, scaling_tables

__all__ = [
    "Inputs",
    "Point",
    "Table",
    "best_table",
    "build_tables",
    "comparison_tables",
    "efficiency_figure",
    "headline",
    "load",
    "make_plots",
    "mark_reference",
    "plot_folder",
    "plot_panels",
    "point_from_record",
    "report",
    "scaling_tables",
    "to_csv",
    "to_html",
    "to_json",
    "to_markdown",
    "versus_batch_figure",
]
