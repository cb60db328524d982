#!/usr/bin/env bash
# What `srun` runs on every node of a Slurm job: ONE torchrun agent per node, which starts this node's
# processes and meets the other nodes' agents at a c10d rendezvous on the job's first node.
#
#   srun --ntasks-per-node=1 notebooks/scripts/slurm/torchrun_node.sh notebooks/scripts/02_ddp_train.py --steps 7
#
# Everything comes from the variables Slurm sets in each task (SLURM_JOB_ID, SLURM_JOB_NODELIST,
# SLURM_JOB_NUM_NODES, SLURM_NODEID, SLURM_GPUS_ON_NODE); these can be overridden:
#   NPROC_PER_NODE  processes per node (default: the node's GPUs, else 1)
#   RDZV_PORT       rendezvous port on the first node (default: 29500 + SLURM_JOB_ID % 1000, see below)
#   IFNAME          network interface for gloo and NCCL to use (default: theirs, see below)
#   PYTHON          the Python that has torch (default: python)
set -euo pipefail

: "${SLURM_JOB_ID:?not inside a Slurm job: run this through srun in an sbatch script}"
: "${SLURM_JOB_NODELIST:?SLURM_JOB_NODELIST is not set}"

# Rendezvous host: the first node of the allocation. SLURM_JOB_NODELIST is compressed ("gpu[03-05,07]");
# `scontrol show hostnames` expands it, one host per line, in the same order on every node. (Not piped into
# `head -n 1`: head exits after one line, scontrol gets SIGPIPE, and with `set -o pipefail` the task dies, 141.)
HOSTS=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
RDZV_HOST=${HOSTS%%$'\n'*}
[ -n "$RDZV_HOST" ] || { echo "scontrol show hostnames '$SLURM_JOB_NODELIST' printed no host" >&2; exit 2; }

# Port: any free port on the first node, the same in every task. A fixed 29500 collides as soon as two jobs
# share a node; a port derived from the job id differs between jobs and is the same in all tasks of one job
# without any task talking to another. (Ports below 1024 need root; stay in 20000-60000, away from the
# ephemeral range 32768-60999 the OS hands out, when your site allows.)
RDZV_PORT=${RDZV_PORT:-$((29500 + SLURM_JOB_ID % 1000))}

NNODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
NPROC_PER_NODE=${NPROC_PER_NODE:-${SLURM_GPUS_ON_NODE:-1}}

# Interface: gloo and NCCL pick an interface themselves (gloo: the one of this host name's address; NCCL, by its
# documentation: interfaces named ib* first, lo and docker* only when nothing else exists). On a cluster whose
# host names resolve to a slow management network, name the fast IP interface (eth1, ib0 for IP over
# InfiniBand, ...), the same on every node: `ip -o -4 route get <first node's address>` says which interface
# reaches the first node. NCCL_SOCKET_IFNAME is the interface of NCCL's bootstrap and socket transport only;
# the InfiniBand adapter of its RDMA transport is NCCL_IB_HCA (e.g. mlx5_0), left to NCCL here.
if [ -n "${IFNAME:-}" ]; then
    export GLOO_SOCKET_IFNAME="$IFNAME" NCCL_SOCKET_IFNAME="$IFNAME"
fi

echo "node ${SLURM_NODEID:-?}/$NNODES ($(hostname)): $NPROC_PER_NODE processes, rendezvous $RDZV_HOST:$RDZV_PORT," \
     "interface ${GLOO_SOCKET_IFNAME:-default}, restart ${SLURM_RESTART_COUNT:-0}"
# --rdzv-id: the job id, so agents of two jobs never join each other's rendezvous; no --node-rank (ignored by
# c10d): once all agents have joined, c10d numbers the nodes in sorted order of (host name, agent's process id,
# a counter), not in the order they arrive (global rank = node rank x NPROC_PER_NODE + local rank).
exec "${PYTHON:-python}" -m torch.distributed.run \
    --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" \
    --rdzv-backend c10d --rdzv-endpoint "$RDZV_HOST:$RDZV_PORT" --rdzv-id "$SLURM_JOB_ID" \
    "$@"
