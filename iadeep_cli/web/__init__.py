"""The monitor as a read-only web page (`iadeep web`): ``view`` turns the monitor's view model
into the page's JSON and holds the page (its HTML, CSS and JavaScript are package data under
``static/``), ``server`` serves both. Beside ``tui/``, one layer above it: it reads the cluster
through ``tui.source`` and draws from ``tui.viewmodel``, as the terminal monitor does; the
``cli`` command imports it only when it runs."""
