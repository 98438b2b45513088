"""ember.bench.zoo_ab's variants (tile_ab takes the same): how `--variants` splits, and what
each variant overrides while it compiles."""

from ember.bench.zoo_ab import _settings, variants_of


def test_a_comma_starts_a_variant_only_before_a_variant_s_name():
    text = "eager,tc,ember,ember:tile.column_rblock=64,tile.split_exact_chunks=0," \
           "ember:convolution_layout=never"
    assert variants_of(text) == ["eager", "tc", "ember",
                                 "ember:tile.column_rblock=64,tile.split_exact_chunks=0",
                                 "ember:convolution_layout=never"]


def test_ember_variants_compile_cold_with_their_own_settings_and_tiles():
    # (a warm entry another variant left would serve the same graph whatever its tiles)
    tiles = "ember:tile.column_rblock=64,tile.split_exact_chunks=0"
    assert _settings(tiles) == {"warm_start": False}
    assert _settings(tiles, "tile.") == {"column_rblock": 64, "split_exact_chunks": False}
    assert _settings("ember:convolution_layout=never,warm_start=1") == \
        {"warm_start": True, "convolution_layout": "never"}
    assert _settings("ember") == {"warm_start": False}
    assert _settings("tc") == {} and _settings("eager", "tile.") == {}
