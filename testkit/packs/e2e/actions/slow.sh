#!/bin/sh
echo "started"
sleep 30
echo "never printed"
