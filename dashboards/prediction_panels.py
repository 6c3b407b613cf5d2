"""The pod dashboard's "Predicted vs measured peak" row (docs/prediction.md, "Predicted vs
measured on the fleet"): what ``oomsight predict`` said a job's training step would need,
carried by the job, against what torch measured, and the error of the prediction.

Queries and panels of the row only; built with the house helpers of ``dashboards.panels``.
"""

from __future__ import annotations

from dashboards import config as c
from dashboards import panels as p
from dashboards.queries import DEV, ID, RANGE, Query, peak, row

PREDICTED = f"oomsight_predicted_peak_allocated_bytes{DEV}"
PREDICTED_RESERVED = f"oomsight_predicted_peak_reserved_bytes{DEV}"
MEASURED = f"oomsight_torch_peak_allocated_bytes{DEV}"
MEASURED_RESERVED = f"oomsight_torch_peak_reserved_bytes{DEV}"


def with_prediction(expr: str, predicted: str = PREDICTED) -> str:
    """``expr`` only for the ranks and GPUs whose job carries a prediction."""
    return f"{expr}\nand on ({c.DEVICE}) {predicted}"


def error(predicted: str, measured: str) -> str:
    """``(predicted - measured) / measured`` per rank and GPU over the time range: the last
    prediction against the highest lifetime peak (negative: the prediction was too low)."""
    return (
        f"max by ({c.DEVICE}) (last_over_time({predicted}[{RANGE}]))\n"
        f"/ max by ({c.DEVICE}) (max_over_time({measured}[{RANGE}])) - 1"
    )


def ratio(predicted: str, measured: str) -> str:
    """``measured / predicted`` per rank and GPU over the time range, as ``OomsightPeakAbovePrediction``
    reads it: above 1 the job needed more than predicted."""
    return (
        f"max by ({c.DEVICE}) (max_over_time({measured}[{RANGE}]))\n"
        f"/ max by ({c.DEVICE}) (last_over_time({predicted}[{RANGE}]))"
    )


ABOVE = 1 + c.THRESHOLDS.prediction_margin_ratio
"""Where ``OomsightPeakAbovePrediction`` fires (with the generator's default margin): red from here on."""
OUTGROWN = p.steps((p.GREEN, None), (p.ORANGE, 1.0), (p.RED, ABOVE))

OVER_TIME = [
    Query(with_prediction(peak(MEASURED)), f"measured peak allocated {ID}"),
    Query(peak(PREDICTED), f"predicted peak allocated {ID}"),
    Query(with_prediction(peak(MEASURED_RESERVED), PREDICTED_RESERVED), f"measured peak reserved {ID}"),
    Query(peak(PREDICTED_RESERVED), f"predicted peak reserved {ID}"),
]
ERRORS = [
    row(f"max by ({c.DEVICE}) (last_over_time({PREDICTED}[{RANGE}]))", "predicted"),
    row(
        f"max by ({c.DEVICE}) (max_over_time({MEASURED}[{RANGE}]))\n"
        f"and on ({c.DEVICE}) last_over_time({PREDICTED}[{RANGE}])",
        "measured",
    ),
    row(error(PREDICTED, MEASURED), "error allocated"),
    row(error(PREDICTED_RESERVED, MEASURED_RESERVED), "error reserved"),
    row(ratio(PREDICTED, MEASURED), "measured / predicted"),
]
HIGHEST = [Query(f"max(\n  {MEASURED}\n  / on ({c.DEVICE}) {PREDICTED}\n)", "highest measured / predicted")]

over_time = p.timeseries(
    "Predicted vs measured peak",
    "Where the job carries a prediction (OOMSIGHT_PREDICTION=the JSON of oomsight predict --json, or "
    "oomsight.record_prediction()): the peak allocated and reserved bytes oomsight predict gave for a training "
    "step, against torch's lifetime peaks (max_memory_allocated(), max_memory_reserved()) of the same rank and "
    "GPU. Empty for jobs without a prediction.",
    OVER_TIME,
)
errors = p.table(
    "Prediction error",
    "Per rank and GPU with a prediction: predicted and measured peak allocated bytes over the time range and the "
    "error of the prediction, (predicted - measured) / measured, for allocated and reserved bytes. Negative: "
    "the job needed more than predicted (docs/prediction.md lists the known misses). Measured / predicted is "
    f"what OomsightPeakAbovePrediction reads: orange above 100 %, red above {ABOVE:.0%}, where the alert fires.",
    ERRORS,
    {
        "namespace": "namespace",
        "pod": "pod",
        "rank": "rank",
        "device": "GPU",
        "Value #A": "Predicted",
        "Value #B": "Measured",
        "Value #C": "Error, allocated",
        "Value #D": "Error, reserved",
        "Value #E": "Measured / predicted",
    },
    [
        p.column("Predicted", "bytes"),
        p.column("Measured", "bytes"),
        p.column("Error, allocated", "percentunit"),
        p.column("Error, reserved", "percentunit"),
        p.column("Measured / predicted", "percentunit", OUTGROWN),
    ],
)
highest = p.stat(
    "Outgrown prediction",
    "The highest measured / predicted peak allocated among the selected ranks with a prediction, now: torch's "
    "lifetime peak over the peak oomsight predict gave the job. Orange above 100 %; red above "
    f"{ABOVE:.0%}, where OomsightPeakAbovePrediction fires (docs/runbooks/oomsightpeakaboveprediction.md: the job "
    "runs otherwise than predicted, or the predictor missed). Empty without a prediction.",
    HIGHEST,
    "percentunit",
    OUTGROWN,
    no_value="no prediction",
)

ROW = [(over_time, 11), (highest, 3), (errors, 10)]
"""The row's cells: (panel, width) as ``dashboards.panels.grid`` places them."""
