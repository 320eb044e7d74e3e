#!/bin/bash
#BERTH --app jupyter --cpu 2 --mem 8Gi --time 4h
# JupyterLab on a node, opened from the job's page ("Open") or at /apps/<job>/ on Berth, by
# the job's owner only (docs/interactive.md#web-apps): berth submit docs/examples/jupyter.sh
#
# What binds where: Jupyter listens on $BERTH_APP_HOST:$BERTH_APP_PORT, the node address the
# Berth server registered the node's agent from and a port the agent found free; the server
# connects there and nowhere else. Its URLs keep the /apps/<job>/ prefix ($BERTH_APP_BASE_URL).
#
# Why Jupyter keeps a token: Berth's proxy lets only the job's owner through, but the port is
# open on the node, where other users' jobs (and, on a node address, other machines) can
# reach it; a Jupyter without a token would run code as you for any of them. Turning its
# token off is safe only where nothing but Berth's proxy can reach that address. So the
# token is $BERTH_APP_TOKEN, a secret for this attempt that the proxy presents on every
# request it lets through: you never type it. It goes through the environment
# (JUPYTER_TOKEN), never the command line, which other users can read.
export JUPYTER_TOKEN="$BERTH_APP_TOKEN"
exec jupyter lab --no-browser \
  --ServerApp.ip="$BERTH_APP_HOST" \
  --ServerApp.port="$BERTH_APP_PORT" --ServerApp.port_retries=0 \
  --ServerApp.base_url="$BERTH_APP_BASE_URL"
