# pipette doctor's probe: what `pipette doctor` checks on a node (src/app/doctor), one
# `key=value` line each, longer outputs between `begin NAME` and `end NAME`. Every value
# arrives as an argument, never as text of this script: $1 torchrun, $2 where the run
# directory goes (absolute), $3 nvidia-smi, $4 the Python facts script, $5 the torchruns of
# venvs pipette-run knows of (one a line: the venv its setup script makes, the one beside
# PIPETTE_MEGATRON_PYTHON), tried when $1 is not on PATH, then nvidia-smi's query arguments. The clock is read first, so the driver can set it against the
# midpoint of the round trip.
echo "clock=$(date +%s.%N)"
t=$1 d=$2 s=$3 f=$4 v=$5
shift 5
echo "path=$PATH"
r=
if r=$(command -v -- "$t"); then echo "torchrun=$r"; else
  r=; echo "torchrun-missing=$t"
  # Not on PATH: a venv's torchrun, when this node has one, so its python is checked too.
  set -f; o=$IFS; IFS='
'
  for c in $v; do
    if [ -z "$r" ] && [ -f "$c" ] && [ -x "$c" ]; then r=$c; echo "torchrun-venv=$r"; fi
  done
  IFS=$o; set +f
fi
# The python torchrun runs the workers with: its #! interpreter, else the python beside it,
# else python3 on PATH.
p=
if [ -n "$r" ] && [ -f "$r" ]; then
  l=$(head -n 1 -- "$r" 2>/dev/null)
  case $l in
    '#!'*)
      i=${l#??}
      i=${i# }
      case $i in */*' '*|'') ;; /*) [ -x "$i" ] && p=$i ;; esac
      ;;
  esac
  for c in python3 python; do
    if [ -z "$p" ] && [ -x "${r%/*}/$c" ]; then p=${r%/*}/$c; fi
  done
fi
if [ -z "$p" ]; then p=$(command -v python3) || p=; fi
if [ -n "$p" ]; then
  echo "python=$p"
  o=$("$p" -c "$f" 2>&1)
  echo "python-status=$?"
  echo "begin python"; printf '%s\n' "$o"; echo "end python"
else
  echo "python-missing="
fi
if n=$(command -v -- "$s"); then
  echo "nvidia-smi=$n"
  o=$("$n" "$@" 2>&1)
  echo "nvidia-smi-status=$?"
  echo "begin nvidia-smi"; printf '%s\n' "$o"; echo "end nvidia-smi"
else
  echo "nvidia-smi-missing=$s"
fi
echo "begin nccl"; env | grep '^NCCL_'; echo "end nccl"
# Free space where the run directory goes: the nearest directory of its path that exists.
# (Shell built-ins only: the PATH may be anything, even one without dirname.)
a=$d
while [ ! -e "$a" ] && [ "$a" != / ]; do
  a=${a%/*}
  [ -n "$a" ] || a=/
done
w=no
if [ -w "$a" ]; then w=yes; fi
echo "disk-dir=$a"
echo "disk-writable=$w"
echo "begin df"; df -Pk -- "$a" 2>&1; echo "end df"
