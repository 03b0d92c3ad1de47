"""What a run reports, the same for every world: the summary, the story, the trace.

summary.py  the --json object and the text a person reads
story.py    step by step, in time order: attempts, quorum, heals, updates, faults, engines
trace.py    Chrome trace JSON (opens in Perfetto)
files.py    the output files a user asked for: checked before the run
interrupt.py  Ctrl-C: the run stops whole, the safety oracles judge it in the time left
"""

from miles_core.report.files import (
    check_writable,
    exit_cli,
    run_cli,
    write_json,
    write_json_lines,
)
from miles_core.report.story import StepStory, step_stories, story_lines
from miles_core.report.summary import (
    faults_report,
    step_metrics,
    summary,
    text_lines,
    world_and_flags,
)
from miles_core.report.trace import chrome_trace

__all__ = [
    "StepStory",
    "check_writable",
    "chrome_trace",
    "exit_cli",
    "faults_report",
    "run_cli",
    "step_metrics",
    "step_stories",
    "story_lines",
    "summary",
    "text_lines",
    "world_and_flags",
    "write_json",
    "write_json_lines",
]
