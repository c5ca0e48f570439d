"""``python -m resource_controller`` runs the ``rc`` command line."""

from resource_controller.cli.main import main

main()
