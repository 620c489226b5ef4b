"""Argument parsing shared by the command-line tools: flags anywhere among the KEY VALUE overrides."""
import os

# argparse takes '-1e-3' or '-inf' for an unknown flag; a leading space makes it an argument (float()
# and the config's literal parsing both ignore the space, which is removed from the overrides below).
_ARGUMENT_MARK = ' '


def parse_args_anywhere(parser, argv):
    """parser.parse_intermixed_args(argv): flags may come before, between or after the positional
    arguments (the overrides), whose values may be negative numbers such as `SOLVER.BASE_LR -1e-3`.
    `--local-rank=N` / `--local_rank N`, which `python -m torch.distributed.launch` passes (as
    detectron2 and mmdetection accept), must agree with LOCAL_RANK in the environment."""
    parser.add_argument('--local-rank', '--local_rank', dest='local_rank', type=int, default=None,
                        help='set by torch.distributed.launch; the same as LOCAL_RANK in the environment')
    args = parser.parse_intermixed_args([_ARGUMENT_MARK + a if _is_negative_number(a) else a for a in argv])
    for name, value in vars(args).items():
        if isinstance(value, list):
            setattr(args, name, [_unmark(v) for v in value])
        elif isinstance(value, str):
            setattr(args, name, _unmark(value))
    _agree_with_environment(parser, args.local_rank)
    return args


def _agree_with_environment(parser, local_rank):
    """LOCAL_RANK from the flag when the launcher did not set it (the job is read from the environment)."""
    if local_rank is None:
        return
    environ_rank = os.environ.get('LOCAL_RANK')
    if environ_rank is None:
        os.environ['LOCAL_RANK'] = str(local_rank)
    elif environ_rank != str(local_rank):
        parser.error(f'--local-rank {local_rank} disagrees with LOCAL_RANK {environ_rank} in the environment')


def _is_negative_number(text):
    if not text.startswith('-'):
        return False
    try:
        float(text)
    except ValueError:
        return False
    return True


def _unmark(value):
    if isinstance(value, str) and value.startswith(_ARGUMENT_MARK) and _is_negative_number(value[1:]):
        return value[1:]
    return value
