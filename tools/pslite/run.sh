#!/bin/bash
# ps-lite's tests/local.sh layout: scheduler, servers and workers as processes on loopback; run where ./bench is.
# usage: run.sh SERVERS WORKERS PORT -> worker JSON lines on stdout
export DMLC_NUM_SERVER=$1 DMLC_NUM_WORKER=$2 DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=$3 DMLC_INTERFACE=lo
DMLC_ROLE=scheduler ./bench > /dev/null 2>&1 &
for ((i=0;i<$1;i++)); do DMLC_ROLE=server ./bench > /dev/null 2>&1 & done
for ((i=0;i<$2;i++)); do DMLC_ROLE=worker ./bench & done
wait
