from ember.cli.main import main

raise SystemExit(main())
