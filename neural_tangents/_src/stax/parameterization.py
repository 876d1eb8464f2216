"""How the weights of `Dense` and the convolutions are scaled.

NTK parameterization (Jacot et al. 2018): `y = W_std / sqrt(fan_in) * W x`
with `W ~ N(0, 1)`, so the gradients w.r.t. every weight are of the same
order and the NTK has a finite limit. Standard parameterization
(Sohl-Dickstein et al. 2020, https://arxiv.org/abs/2001.07301): the stored
`W ~ N(0, W_std^2 / fan_in)` is used as is.

Its own module so that `dense` (`Dense`) and `convolution` parse the same
enum without importing each other.
"""
import enum


class Parameterization(str, enum.Enum):
  """How weights are scaled: `NTK` (`W_std / sqrt(fan_in) * W`) or `STANDARD`.

  Example:
    >>> Parameterization('standard')
    <Parameterization.STANDARD: 'standard'>
  """
  NTK = 'ntk'
  STANDARD = 'standard'
