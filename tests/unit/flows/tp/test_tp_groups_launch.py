"""What `kvtransit up` starts for a TP group (flows/tp/launch.py): its followers' and switch's command lines, the
leader's `--tp-group`, distinct group ids per role and instance, and the one-line refusal of groups this host cannot
start."""

from __future__ import annotations

import json

import pytest

from kvtransit.flows.tp import launch as tp_groups
from kvtransit.flows.tp.group.leader import LeaderConfig
from kvtransit.flows.tp.group.orders import FollowerConfig
from kvtransit.flows.tp.section import TpSection
from kvtransit.harness.up.flow_launch import check_host_room, flow_launches
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario


def test_each_role_and_instance_has_its_own_group():
    ids = {tp_groups.group_id(role, i) for role in tp_groups.ROLES for i in range(8)}
    assert len(ids) == 16


def test_a_followers_config_is_the_scaled_scaleup_link_and_names_its_leader():
    s = Scenario(prefill_tp=4, dilation=2.0, scale=1 / 64)
    argv = tp_groups.follower_argv(s, "prefill", 1, 3)
    assert argv[1:4] == ["-m", "kvtransit.flows.tp.group", "--config"]
    config = FollowerConfig(**json.loads(argv[4]))
    assert (config.group, config.rank, config.size, config.mode, config.leader) == (1002, 3, 4, "ring", "prefill-1")
    assert config.rate_Bps == pytest.approx(TpSection.of(s).scaled_link(s).bandwidth_Bps)
    assert config.latency_s == pytest.approx(10e-6)


def test_the_leader_is_told_its_followers_ring_and_control_ports_and_the_switch():
    s = Scenario.build(decode_tp=4, allreduce="switch")
    followers = [{"control_port": 100 + r, "ring_port": 200 + r} for r in range(3)]
    config = LeaderConfig(**json.loads(tp_groups.leader_config(s, "decode", 0, followers, {"listen_port": 300})))
    assert config.size == 4 and config.mode == "switch" and config.switch == ["127.0.0.1", 300]
    assert config.followers[2] == {"control": ["127.0.0.1", 102], "ring": ["127.0.0.1", 202]}


def test_a_switch_serves_one_allreduce_a_step_and_may_idle():
    argv = tp_groups.switch_argv(Scenario.build(decode_tp=2, allreduce="switch"), "decode", 0, "127.0.0.1")
    config = json.loads(argv[argv.index("--switch-config") + 1])
    assert config["collectives"] == 1 and config["idle_s"] > config["deadline_s"]
    assert argv[argv.index("--ranks") + 1] == "2" and argv[argv.index("--group") + 1] == "1"


def test_groups_larger_than_the_host_can_start_are_one_line_with_the_sizes_it_can():
    fits = Scenario(decode_tp=8)
    check_host_room(fits, flow_launches(fits), cores=2)  # 7 followers: within 4 a core
    too_big = Scenario.build(decode_tp=16, allreduce="switch", decode=1)
    with pytest.raises(ConfigError) as err:
        check_host_room(too_big, flow_launches(too_big), cores=2)
    message = str(err.value)
    assert message.startswith("decode_tp: 1 decode instance(s) of TP 16 need 16 more processes")
    assert "(valid: 1, 2, 4, 8)" in message and "\n" not in message
