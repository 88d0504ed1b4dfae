"""PE build-option cases shared by the PE's tests (``tests/amaranth/test_pe.py``: the PE refuses
them) and by the build-options object's (``tests/golden/test_config.py``: ``PEOptions`` refuses
them), so both tiers check the same rule on the same table."""

#: Options under which ``narrow_out=True`` is accepted (small preset, W = 512: W/64/P = 2).
NARROW_OUT_OK = {"tile_passes": 4, "out_banks": 1, "out_valid_bits": False, "combine_units": 2,
                 "fp32_units": 2}

#: (change to NARROW_OUT_OK, the end of the refusal) for ``narrow_out=True``; every message
#: starts "narrow_out: OUT in W/P-bit parts ".
NARROW_OUT_NEEDS = (
    ({"tile_passes": 1}, "needs tile_passes 2 or 4, got tile_passes=1"),
    ({"out_banks": 2}, "needs out_banks 1, got out_banks=2"),
    ({"out_valid_bits": True}, "needs out_valid_bits False, got out_valid_bits=True"),
    ({"combine_units": 4}, "needs combine_units at most W/64/P = 2, got combine_units=4"),
    ({"fp32_units": 4}, "needs fp32_units at most W/64/P = 2, got fp32_units=4"),
)
