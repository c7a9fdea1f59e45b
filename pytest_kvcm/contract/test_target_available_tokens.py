"""The engine's own capacity answer, where it has one (TensorRT-LLM's ``get_num_available_tokens``): it must
name exactly the page boundary a generation-shaped request can fill, and give back the bound itself when the
pool is larger. vLLM and transformers have no such query; their targets skip.
"""

import pytest

from pytest_kvcm.targets import PoolSpec


def _target(kvcm_target, spec):
    target = kvcm_target(spec)
    if not hasattr(target, "available_tokens"):
        pytest.skip(f"{target.name} has no available-tokens query")
    return target


@pytest.mark.parametrize("window", [None, 32], ids=["full", "window32"])
@pytest.mark.parametrize("lookahead", [0, 4])
@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_engine_answer_fits_and_is_the_boundary(kvcm_target, batch_size, lookahead, window):
    # two requests' windows in the sliding pool (B = 2): far fewer pages than the full pool's twelve
    target = _target(kvcm_target, PoolSpec(num_pages=12, sliding_window=window, max_batch_size=2))
    ps = target.page_size
    shorts = [f"short{i}" for i in range(batch_size - 1)]
    assert target.allocate_generation(shorts, [1 + lookahead] * len(shorts), lookahead)
    answer = target.available_tokens(target.max_model_len, batch_size, lookahead)
    boundary = target.free_pages() * ps - lookahead
    if not target.differs("free_pages", "the answer is not compared with the free count (not one pool's); that it "
                                        "fits and one token more does not is checked as always"):
        assert answer == boundary, (f"{target}: {target.free_pages()} free pages of {ps} leave {boundary} tokens + "
                                    f"lookahead {lookahead}; the engine answered {answer}")
    assert target.allocate_generation(["longest"], [answer], lookahead), f"{target}: its own answer {answer} refused"
    target.free("longest")
    if target.differs("exact_pool_size", "one token more than the answer may fit: the answer stops at the token "
                                         "quota asked, the pools hold more (that the answer fits is checked)"):
        return
    assert answer == target.max_model_len or not target.allocate_generation(["longest"], [answer + 1], lookahead), (
        f"{target}: {answer + 1} tokens + lookahead {lookahead} fit, one more than the engine's answer {answer}")


@pytest.mark.parametrize("lookahead", [0, 4])
def test_engine_answers_the_bound_when_the_pool_is_larger(kvcm_target, lookahead):
    target = _target(kvcm_target, PoolSpec(num_pages=64))
    bound = 5 * target.page_size + 3
    assert target.available_tokens(bound, 1, lookahead) == bound, (
        f"{target}: a {bound}-token bound fits a pool of {target.free_pages()} pages (lookahead {lookahead})")
