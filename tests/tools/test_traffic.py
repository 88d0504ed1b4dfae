"""The stream traffic patterns (:mod:`elmoe3d.sim.traffic`): a driver's ports checked by
:meth:`Traffic.for_ports`, so a misspelt port name is an error, not a value silently ignored."""

import pytest

from elmoe3d.sim.traffic import FLOWS, IDLE_STALL, ROUGH, SMOOTH, Traffic

PE_PORTS = ("cmd", "ld", "link_i", "o", "link_o")


def test_for_ports_keeps_the_pattern():
    t = ROUGH.for_ports(*PE_PORTS)
    assert t == ROUGH and hash(t) == hash(ROUGH) and t.known == PE_PORTS
    assert [t.idle_at(p) for p in ("cmd", "ld", "link_i")] == [0.3, 0.4, 0.4]
    assert [t.backpressure_at(p) for p in ("o", "link_o")] == [0.5, 0.5]
    assert ROUGH.known == () and ROUGH.idle_at("anything") == 0.3    # ports not stated yet


def test_unknown_port_in_the_pattern():
    typo = Traffic("typo", ports={"lnk_o": 0.3})
    with pytest.raises(ValueError, match=r"Traffic 'typo': unknown port 'lnk_o'; the ports "
                                         r"are cmd, ld, link_i, o, link_o"):
        typo.for_ports(*PE_PORTS)
    with pytest.raises(ValueError, match="unknown port 'lnk_o'"):
        ROUGH.for_ports(*PE_PORTS).but("jammed", lnk_o=0.9)


def test_unknown_port_asked_for():
    t = SMOOTH.for_ports("i", "o")
    with pytest.raises(ValueError, match=r"Traffic 'smooth': unknown port 'x'; the ports are "
                                         r"i, o"):
        t.idle_at("x")
    with pytest.raises(ValueError, match="unknown port 'oo'"):
        t.backpressure_at("oo")
    with pytest.raises(ValueError, match="for_ports needs at least one port"):
        SMOOTH.for_ports()


def test_idle_stall_is_the_last_flow():
    assert FLOWS[-1] is IDLE_STALL
    assert (IDLE_STALL.idle, IDLE_STALL.backpressure) == (0.3, 0.6)
