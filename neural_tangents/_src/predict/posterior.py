"""What `get` selects in `predict`: the flow and prior kernels of each
posterior ('nngp', 'ntk', 'ntkgp') and the `Gaussian` result."""
from typing import Any, NamedTuple, Optional, Sequence

from neural_tangents._src.predict.layout import Array
from neural_tangents._src.utils import arguments
from neural_tangents._src.utils import utils
from neural_tangents._src.utils.typing import Get


# What `get=None` returns.
_GETS = ('nngp', 'ntk')


class Posterior(NamedTuple):
  """The two kernels that define the prediction of one `get`.

  Attributes:
    flow: the train-train kernel that drives gradient flow and is inverted
      (the only one that `diag_reg` regularizes).
    prior: the covariance of the outputs at initialization, `f_0`.
  """
  flow: str
  prior: str


POSTERIORS = {
    'nngp': Posterior(flow='nngp', prior='nngp'),
    'ntk': Posterior(flow='ntk', prior='nngp'),
    'ntkgp': Posterior(flow='ntk', prior='ntk'),
}


class Gaussian(NamedTuple):
  """A Gaussian distribution over outputs.

  Attributes:
    mean: the mean, shaped like the outputs.
    covariance: the covariance in the kernel layout (see the module
      docstring); `None` when not computed.
  """
  mean: Array
  covariance: Optional[Array]


def parse_posterior_get(get: Get) -> tuple[tuple[str, ...], bool]:
  """`get` -> (names, whether a single value, not a namedtuple, is returned)."""
  names, single = arguments.parse_get(get, tuple(POSTERIORS))
  return names or _GETS, single


def kernels_needed(names: Sequence[str], compute_cov: bool) -> tuple[str, ...]:
  """Kernels ('nngp', 'ntk' in this order) that predictions of `names` use."""
  used = set()
  for name in names:
    used.add(POSTERIORS[name].flow)
    if compute_cov:
      used.add(POSTERIORS[name].prior)
  return tuple(k for k in ('nngp', 'ntk') if k in used)


def results_by_get(values: dict[str, Any], names: tuple[str, ...], single: bool,
                   typename: str) -> Any:
  """`values[names[0]]` if `single`, else a namedtuple `typename` of the
  values of `names`, in that order."""
  if single:
    return values[names[0]]
  return utils.get_namedtuple(names, typename)(
      *(values[name] for name in names))
