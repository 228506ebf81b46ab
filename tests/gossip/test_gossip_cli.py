"""``fedplat gossip sim`` and the disruption bench, end to end on digits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedplat.cli import main
from tests.support import REPO

EXAMPLES = REPO / "examples" / "scenarios"


def test_gossip_sim_cli_writes_summary_and_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedplat.store import Store

    out = tmp_path / "summary.json"
    db = tmp_path / "g.db"
    rc = main(
        [
            "gossip",
            "sim",
            "--scenario",
            str(EXAMPLES / "ring_kill.toml"),
            "--store",
            str(db),
            "--output",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["scenario"] == "ring-kill" and printed["alive"] == 7
    summary = json.loads(out.read_text())
    assert len(summary["accuracy_per_round"]) == 16
    assert [c["kind"] for c in summary["changes"]] == [
        "gossip_node_removed",
        "gossip_node_rejoined",
    ]
    assert summary["changes"][0]["nodes"] == [2, 5]
    with Store(str(db)) as store:
        run = store.get_run(summary["run_id"])
        assert run is not None and run.status == "completed"
        assert run.config["mode"] == "gossip"


def test_gossip_sim_cli_reports_scenario_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\nrounds: 3\ntopology: {kind: ring, n: 4}\n"
        "events: [{round: 1, action: remove_nodes, nodes: [7]}]\n"
    )
    assert main(["gossip", "sim", "--scenario", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "events.0 (remove_nodes): nodes [7] do not exist" in err


def test_disruption_bench_smoke(tmp_path: Path) -> None:
    from bench.gossip_disruption import main as bench

    out = tmp_path / "g.json"
    assert (
        bench(
            [
                "--dataset",
                "digits",
                "--nodes",
                "12",
                "--rounds",
                "3",
                "--at",
                "1",
                "--fractions",
                "0.25",
                "--hidden",
                "16",
                "--lr",
                "0.1",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    assert set(data) == {"rows", "baseline_accuracy", "setup", "environment"}
    assert data["environment"]["commit"]  # every result says which code made it
    assert len(data["rows"]) == 4  # degree/random x with/without data
    for row in data["rows"]:
        assert set(row) == {
            "removed_fraction",
            "removal",
            "with_data",
            "final_mean_accuracy",
            "final_min_accuracy",
            "components",
        }
    assert 0 < data["baseline_accuracy"] <= 1


def test_certs_and_identity_commands_make_a_working_membership(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The manual set-up of docs/gossip.md: a CA, peer certificates, identity
    keys, a membership file assembled from ``fedplat gossip identity``."""
    import yaml

    from fedplat.gossip.security import load_peer_security

    pki = tmp_path / "pki"
    assert main(["certs", "ca", "--dir", str(pki)]) == 0
    assert main(["certs", "peer", "--dir", str(pki), "--name", "a", "--name", "b"]) == 0
    members = []
    for name in ("a", "b"):
        capsys.readouterr()
        rc = main(
            [
                "gossip",
                "identity",
                "--id",
                name,
                "--state-dir",
                str(tmp_path / name),
                "--cert",
                str(pki / f"{name}.pem"),
            ]
        )
        assert rc == 0
        members += yaml.safe_load(capsys.readouterr().out)["members"]
    membership = tmp_path / "members.yaml"
    membership.write_text(yaml.safe_dump({"members": members}))
    sec = load_peer_security(
        "a",
        membership=membership,
        state_dir=tmp_path / "a",
        ca=pki / "ca.pem",
        cert=pki / "a.pem",
        key=pki / "a.key",
    )
    assert sec.tls is not None and sec.membership.peer("b") is not None
    assert main(["certs", "peer", "--dir", str(pki), "--name", "bad_name"]) == 2
    assert "is not a host or IP" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "mutual TLS needs --ca, --cert and --key (or the explicit --insecure)"),
        (["--insecure", "--ca", "x.pem"], "--insecure does not take TLS files"),
        (["--ca", "x.pem", "--cert", "y.pem", "--key", "z"], "cannot read the CA"),
    ],
)
def test_gossip_node_refuses_bad_security_files_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    from fedplat.gossip.pki import make_cluster

    files = make_cluster(tmp_path, ["0", "1"], tls=False)
    args = ["gossip", "node", "--id", "0", "--membership", str(files.membership)]
    args += ["--state-dir", str(files.state_dir("0")), *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_gossip_node_without_membership_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["gossip", "node", "--id", "0"])
    assert info.value.code == 2
    assert "--membership" in capsys.readouterr().err


def test_every_example_scenario_gets_certificates_keys_and_a_membership(
    tmp_path: Path, tabular_app: Path
) -> None:
    from fedplat.gossip.launcher import ProcessLauncher

    for path in sorted(EXAMPLES.glob("*.*")):
        # tabular_ring.yaml's plug-ins are checked as the launcher starts.
        launcher = ProcessLauncher(path, tmp_path / path.stem, app_dir=tabular_app)
        files = launcher.cluster
        n = launcher.network.n
        members = files.load_membership()
        assert len(members) == n + 1 and members.get("launcher") is not None
        last = str(n - 1)
        sec = files.security(last)
        assert sec.tls is not None and sec.tls.info.common_name == last
        assert members.peer(last).address == launcher.address(n - 1)  # type: ignore[union-attr]
        args = files.node_args(last)
        assert "--insecure" not in args and "--cert" in args
        for c in launcher.clients.values():
            c.close()
