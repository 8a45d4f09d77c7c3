"""A league's wiring is checked before anything starts: one located error line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from sfbus.cli import main

TOPOLOGIES = Path(__file__).parents[3] / "topologies"


@pytest.mark.parametrize(("topology", "override", "error"), [
    ("league_rps.yaml", "opponent_slots=0",
     "league_rps.yaml:{league}:7: actor 'league': the league serves its snapshots in opponent "
     "slots: set settings.opponent_slots >= 1"),
    ("league_rps.yaml", "policy_mapping=sfbus_components.league.opponents:UNPLAYED_WIN_RATE",
     "actor 'rollout': policy_mapping"),
    ("league_rps.yaml", "fixed_opponents=[/nonexistent/rock.pt]",
     "actor 'league': fixed_opponents: /nonexistent/rock.pt: cannot read it"),
    ("selfplay_duel.yaml", "opponent_slots=2",
     "actor 'rollout': policy_mapping 'sfbus_components.sampling.policy_mapping:RandomMapping' "
     "with {'opponent_slots': 2}: "),
])
def test_a_league_without_slots_or_its_mapping_is_refused(topology: str, override: str,
                                                         error: str,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    # where the league actor's errors point: its line in the file
    lines = (TOPOLOGIES / topology).read_text().splitlines()
    league = next((n for n, line in enumerate(lines, 1) if line.startswith("      league:")), 0)
    error = error.replace("{league}", str(league))
    assert main(["validate", str(TOPOLOGIES / topology), "--set", override]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines()
             if not line.startswith("note:")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and error in lines[0], lines


def test_the_league_topologies_validate(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("league_rps.yaml", "league_duel.yaml"):
        assert main(["validate", str(TOPOLOGIES / name)]) == 0, capsys.readouterr().err
