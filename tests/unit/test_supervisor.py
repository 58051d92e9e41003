"""The supervisor restarts a child on the ports it first announced."""

from kvtransit.harness.up.supervisor import pinned_argv


def test_a_restart_pins_every_listening_flag_to_the_announced_port_and_keeps_the_host():
    argv = ["python", "-m", "kvtransit.cli", "middlebox", "--listen", "10.0.0.2:0", "--decode", "10.0.0.3:41000",
            "--metrics-listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0", "--name", "middlebox-0"]
    ready = {"role": "middlebox", "listen_port": 40001, "metrics_port": 40002, "control_port": 40003}
    assert pinned_argv(argv, ready) == [
        "python", "-m", "kvtransit.cli", "middlebox", "--listen", "10.0.0.2:40001", "--decode", "10.0.0.3:41000",
        "--metrics-listen", "127.0.0.1:40002", "--control-listen", "127.0.0.1:40003", "--name", "middlebox-0"]


def test_flags_the_child_did_not_announce_are_left_alone():
    argv = ["decode", "--listen", "127.0.0.1:0", "--client-listen", "127.0.0.1:0"]
    assert pinned_argv(argv, {"listen_port": 5}) == ["decode", "--listen", "127.0.0.1:5", "--client-listen",
                                                      "127.0.0.1:0"]
