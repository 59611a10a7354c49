#!/bin/bash
sed -i -e 's/^port = 80$/port = 8080/' -e 's/^debug = true$/debug = false/' /app/service.conf
